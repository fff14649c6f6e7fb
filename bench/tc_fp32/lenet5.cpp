// Defined in the CUDA source (bench/tc_fp32/lenet5.cu).
struct LeNetWeights {
    const float* c1w; const float* c1b;
    const float* c2w; const float* c2b;
    const float* f1w; const float* f1b;
    const float* f2w; const float* f2b;
    const float* f3w; const float* f3b;
};
void launch_lenet5(const float* x, const LeNetWeights& p, float* logits, int batch, int classes, void* stream);

torch::Tensor lenet5(torch::Tensor x, torch::Tensor c1w, torch::Tensor c1b, torch::Tensor c2w, torch::Tensor c2b,
                     torch::Tensor f1w, torch::Tensor f1b, torch::Tensor f2w, torch::Tensor f2b, torch::Tensor f3w,
                     torch::Tensor f3b, int64_t stream) {
    TORCH_CHECK(x.dim() == 4 && x.size(1) == 1 && x.size(2) == 32 && x.size(3) == 32,
                "lenet5: x must be (batch, 1, 32, 32)");
    x = x.contiguous();
    const int64_t batch = x.size(0), classes = f3b.numel();
    TORCH_CHECK(batch < (1LL << 31) / 1024 && classes > 0, "lenet5: batch must fit int32 offsets");
    LeNetWeights p{f32_arg(c1w, x, "lenet5: conv1.weight", 150), f32_arg(c1b, x, "lenet5: conv1.bias", 6),
                   f32_arg(c2w, x, "lenet5: conv2.weight", 2400), f32_arg(c2b, x, "lenet5: conv2.bias", 16),
                   f32_arg(f1w, x, "lenet5: fc1.weight", 48000), f32_arg(f1b, x, "lenet5: fc1.bias", 120),
                   f32_arg(f2w, x, "lenet5: fc2.weight", 10080), f32_arg(f2b, x, "lenet5: fc2.bias", 84),
                   f32_arg(f3w, x, "lenet5: fc3.weight", classes * 84), f32_arg(f3b, x, "lenet5: fc3.bias", classes)};
    f32_arg(x, x, "lenet5: x", batch * 1024);
    auto logits = torch::empty({batch, classes}, x.options());
    launch_lenet5(x.data_ptr<float>(), p, logits.data_ptr<float>(), static_cast<int>(batch),
                  static_cast<int>(classes), reinterpret_cast<void*>(stream));
    return logits;
}
