// Defined in the CUDA source (bench/tc_fp32/vision_attention.cu).
void launch_to_tokens(const float* x, float* tokens, int B, int C, int L, void* stream);
void launch_mha_flash(const float* qkv, float* out, int L, int N, int E, int H, float scale, void* stream);
void launch_residual_layernorm(const float* a, const float* x, const float* gamma, const float* beta, float* y, int B,
                               int C, int L, float eps, void* stream);

torch::Tensor to_tokens(torch::Tensor x, int64_t stream) {
    f32_arg(x, x, "to_tokens: x");
    TORCH_CHECK(x.dim() == 4, "to_tokens: x must be (B, C, H, W)");
    const int64_t B = x.size(0), C = x.size(1), L = x.size(2) * x.size(3);
    TORCH_CHECK(C % 32 == 0 && C <= 256, "to_tokens: the kernel takes 32 to 256 channels, a multiple of 32");
    TORCH_CHECK(B * C * L < (1LL << 31), "to_tokens: sizes must fit int32");
    auto tokens = torch::empty({L * B, C}, x.options());
    launch_to_tokens(x.data_ptr<float>(), tokens.data_ptr<float>(), static_cast<int>(B), static_cast<int>(C),
                     static_cast<int>(L), reinterpret_cast<void*>(stream));
    return tokens;
}

torch::Tensor mha_attention(torch::Tensor qkv, int64_t L, int64_t N, int64_t E, int64_t H, double scale,
                            int64_t stream) {
    f32_arg(qkv, qkv, "mha_attention: qkv");
    TORCH_CHECK(qkv.numel() == L * N * 3 * E, "mha_attention: qkv must hold L x N x 3E values");
    TORCH_CHECK(H > 0 && E % H == 0 && (E / H == 32 || E / H == 64), "mha_attention: head size 32 or 64");
    TORCH_CHECK(L % 64 == 0, "mha_attention: the kernel takes sequences of a multiple of 64");
    TORCH_CHECK(L * N * 3 * E < (1LL << 31), "mha_attention: sizes must fit int32");
    auto out = torch::empty({L * N, E}, qkv.options());
    launch_mha_flash(qkv.data_ptr<float>(), out.data_ptr<float>(), static_cast<int>(L), static_cast<int>(N),
                     static_cast<int>(E), static_cast<int>(H), static_cast<float>(scale),
                     reinterpret_cast<void*>(stream));
    return out;
}

torch::Tensor residual_layernorm(torch::Tensor a, torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double eps,
                                 int64_t stream) {
    f32_arg(a, x, "residual_layernorm: a");
    f32_arg(x, x, "residual_layernorm: x");
    f32_arg(gamma, x, "residual_layernorm: weight");
    f32_arg(beta, x, "residual_layernorm: bias");
    TORCH_CHECK(x.dim() == 4, "residual_layernorm: x must be (B, C, H, W)");
    const int64_t B = x.size(0), C = x.size(1), L = x.size(2) * x.size(3);
    TORCH_CHECK(C % 32 == 0 && C <= 256, "residual_layernorm: the kernel takes 32 to 256 channels, a multiple of 32");
    TORCH_CHECK(a.numel() == x.numel() && gamma.numel() == C && beta.numel() == C, "residual_layernorm: shapes differ");
    auto y = torch::empty_like(x);
    launch_residual_layernorm(a.data_ptr<float>(), x.data_ptr<float>(), gamma.data_ptr<float>(), beta.data_ptr<float>(),
                              y.data_ptr<float>(), static_cast<int>(B), static_cast<int>(C), static_cast<int>(L),
                              static_cast<float>(eps), reinterpret_cast<void*>(stream));
    return y;
}
