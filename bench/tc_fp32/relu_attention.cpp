// Defined in the CUDA source (bench/tc_fp32/relu_attention.cu).
void launch_relu_attention(const float* qkv, float* y, int B, int T, int C, int H, float scale, void* stream);

torch::Tensor relu_attention(torch::Tensor qkv, int64_t B, int64_t T, int64_t C, int64_t H, double scale,
                             int64_t stream) {
    f32_arg(qkv, qkv, "relu_attention: qkv (B, T, 3C)", B * T * 3 * C);
    TORCH_CHECK(H > 0 && C == 64 * H, "relu_attention: the kernel's head size is 64 (C == 64 x n_head)");
    TORCH_CHECK(T % 64 == 0, "relu_attention: the kernel takes sequences of a multiple of 64");
    TORCH_CHECK(B * T < (1LL << 31) / (3 * C), "relu_attention: sizes must fit int32 rows");
    auto y = torch::empty({B, T, C}, qkv.options());
    launch_relu_attention(qkv.data_ptr<float>(), y.data_ptr<float>(), static_cast<int>(B), static_cast<int>(T),
                          static_cast<int>(C), static_cast<int>(H), static_cast<float>(scale),
                          reinterpret_cast<void*>(stream));
    return y;
}
