// Defined in the CUDA source (bench/tc_fp32/lenet5.cu).
struct LeNetWeights {
    const float* c1w; const float* c1b;
    const float* c2w; const float* c2b;
    const float* f1w; const float* f1b;
    const float* f2w; const float* f2b;
    const float* f3w; const float* f3b;
};
void launch_lenet5(const float* x, const LeNetWeights& p, float* logits, int batch, int classes, void* stream);

namespace {
const float* lenet_param(const torch::Tensor& t, const torch::Tensor& x, int64_t numel, const char* what) {
    TORCH_CHECK(t.is_cuda() && t.device() == x.device() && t.scalar_type() == torch::kFloat32 && t.is_contiguous(),
                "lenet5: ", what, " must be a contiguous float32 tensor on the input's device");
    TORCH_CHECK(t.numel() == numel, "lenet5: ", what, " must hold ", numel, " values (LeNet-5's shapes)");
    return t.data_ptr<float>();
}
}  // namespace

torch::Tensor lenet5(torch::Tensor x, torch::Tensor c1w, torch::Tensor c1b, torch::Tensor c2w, torch::Tensor c2b,
                     torch::Tensor f1w, torch::Tensor f1b, torch::Tensor f2w, torch::Tensor f2b, torch::Tensor f3w,
                     torch::Tensor f3b, int64_t stream) {
    TORCH_CHECK(x.dim() == 4 && x.size(1) == 1 && x.size(2) == 32 && x.size(3) == 32,
                "lenet5: x must be (batch, 1, 32, 32)");
    x = x.contiguous();
    const int64_t batch = x.size(0), classes = f3b.numel();
    TORCH_CHECK(batch < (1LL << 31) / 1024 && classes > 0, "lenet5: batch must fit int32 offsets");
    LeNetWeights p{lenet_param(c1w, x, 150, "conv1.weight"), lenet_param(c1b, x, 6, "conv1.bias"),
                   lenet_param(c2w, x, 2400, "conv2.weight"), lenet_param(c2b, x, 16, "conv2.bias"),
                   lenet_param(f1w, x, 48000, "fc1.weight"), lenet_param(f1b, x, 120, "fc1.bias"),
                   lenet_param(f2w, x, 10080, "fc2.weight"), lenet_param(f2b, x, 84, "fc2.bias"),
                   lenet_param(f3w, x, classes * 84, "fc3.weight"), lenet_param(f3b, x, classes, "fc3.bias")};
    lenet_param(x, x, batch * 1024, "x");
    auto logits = torch::empty({batch, classes}, x.options());
    launch_lenet5(x.data_ptr<float>(), p, logits.data_ptr<float>(), static_cast<int>(batch),
                  static_cast<int>(classes), reinterpret_cast<void*>(stream));
    return logits;
}
