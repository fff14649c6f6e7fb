// Defined in the CUDA source (bench/tc_fp32/fire_module.cu).
void launch_fire_module(const float* x, const float* ws, const float* bs, const float* w1, const float* b1,
                        const float* w3, const float* b3, float* y, int N, int cin, int s, int e1, int e3, int H, int W,
                        void* stream);

namespace {
const float* fire_param(const torch::Tensor& t, const torch::Tensor& x, int64_t numel, const char* what) {
    TORCH_CHECK(t.is_cuda() && t.device() == x.device() && t.scalar_type() == torch::kFloat32 && t.is_contiguous(),
                "fire_module: ", what, " must be a contiguous float32 tensor on the input's device");
    TORCH_CHECK(t.numel() == numel, "fire_module: ", what, " must hold ", numel, " values");
    return t.data_ptr<float>();
}
}  // namespace

torch::Tensor fire_module(torch::Tensor x, torch::Tensor ws, torch::Tensor bs, torch::Tensor w1, torch::Tensor b1,
                          torch::Tensor w3, torch::Tensor b3, int64_t stream) {
    TORCH_CHECK(x.dim() == 4, "fire_module: x must be (N, C, H, W)");
    x = x.contiguous();
    const int64_t N = x.size(0), cin = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t s = bs.numel(), e1 = b1.numel(), e3 = b3.numel();
    TORCH_CHECK(N * (e1 + e3) * H * W < (1LL << 62) && H < (1LL << 31) && W < (1LL << 31), "fire_module: too large");
    const float* xp = fire_param(x, x, N * cin * H * W, "x");
    const float* wsp = fire_param(ws, x, s * cin, "squeeze.weight");
    const float* bsp = fire_param(bs, x, s, "squeeze.bias");
    const float* w1p = fire_param(w1, x, e1 * s, "expand1x1.weight");
    const float* b1p = fire_param(b1, x, e1, "expand1x1.bias");
    const float* w3p = fire_param(w3, x, e3 * s * 9, "expand3x3.weight");
    const float* b3p = fire_param(b3, x, e3, "expand3x3.bias");
    auto y = torch::empty({N, e1 + e3, H, W}, x.options());
    launch_fire_module(xp, wsp, bsp, w1p, b1p, w3p, b3p, y.data_ptr<float>(), static_cast<int>(N),
                       static_cast<int>(cin), static_cast<int>(s), static_cast<int>(e1), static_cast<int>(e3),
                       static_cast<int>(H), static_cast<int>(W), reinterpret_cast<void*>(stream));
    return y;
}
