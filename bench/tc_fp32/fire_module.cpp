// Defined in the CUDA source (bench/tc_fp32/fire_module.cu).
void launch_fire_module(const float* x, const float* ws, const float* bs, const float* w1, const float* b1,
                        const float* w3, const float* b3, float* y, int N, int cin, int s, int e1, int e3, int H, int W,
                        void* stream);

torch::Tensor fire_module(torch::Tensor x, torch::Tensor ws, torch::Tensor bs, torch::Tensor w1, torch::Tensor b1,
                          torch::Tensor w3, torch::Tensor b3, int64_t stream) {
    TORCH_CHECK(x.dim() == 4, "fire_module: x must be (N, C, H, W)");
    x = x.contiguous();
    const int64_t N = x.size(0), cin = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t s = bs.numel(), e1 = b1.numel(), e3 = b3.numel();
    TORCH_CHECK(N * (e1 + e3) * H * W < (1LL << 62) && H < (1LL << 31) && W < (1LL << 31), "fire_module: too large");
    const float* xp = f32_arg(x, x, "fire_module: x", N * cin * H * W);
    const float* wsp = f32_arg(ws, x, "fire_module: squeeze.weight", s * cin);
    const float* bsp = f32_arg(bs, x, "fire_module: squeeze.bias", s);
    const float* w1p = f32_arg(w1, x, "fire_module: expand1x1.weight", e1 * s);
    const float* b1p = f32_arg(b1, x, "fire_module: expand1x1.bias", e1);
    const float* w3p = f32_arg(w3, x, "fire_module: expand3x3.weight", e3 * s * 9);
    const float* b3p = f32_arg(b3, x, "fire_module: expand3x3.bias", e3);
    auto y = torch::empty({N, e1 + e3, H, W}, x.options());
    launch_fire_module(xp, wsp, bsp, w1p, b1p, w3p, b3p, y.data_ptr<float>(), static_cast<int>(N),
                       static_cast<int>(cin), static_cast<int>(s), static_cast<int>(e1), static_cast<int>(e3),
                       static_cast<int>(H), static_cast<int>(W), reinterpret_cast<void*>(stream));
    return y;
}
