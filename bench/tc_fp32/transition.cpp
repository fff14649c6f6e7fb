// Defined in the CUDA source (bench/tc_fp32/transition.cu).
void launch_densenet_transition(const float* x, const float* mean, const float* var, const float* gamma,
                                const float* beta, float eps, const float* w, float* y, int N, int cin, int cout,
                                int H, int W, void* stream);

namespace {
const float* tr_param(const torch::Tensor& t, const torch::Tensor& x, int64_t numel, const char* what) {
    TORCH_CHECK(t.is_cuda() && t.device() == x.device() && t.scalar_type() == torch::kFloat32 && t.is_contiguous(),
                "densenet_transition: ", what, " must be a contiguous float32 tensor on the input's device");
    TORCH_CHECK(t.numel() == numel, "densenet_transition: ", what, " must hold ", numel, " values");
    return t.data_ptr<float>();
}
}  // namespace

// AvgPool2d(2)(conv1x1(relu(batchnorm(x)))) with BatchNorm's running statistics (inference).
torch::Tensor densenet_transition(torch::Tensor x, torch::Tensor mean, torch::Tensor var, torch::Tensor gamma,
                                  torch::Tensor beta, double eps, torch::Tensor w, int64_t stream) {
    TORCH_CHECK(x.dim() == 4 && w.dim() == 4 && w.size(2) == 1 && w.size(3) == 1, "densenet_transition: shapes");
    x = x.contiguous();
    const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), O = w.size(0);
    TORCH_CHECK(w.size(1) == C && W % 2 == 0 && H >= 2, "densenet_transition: the weight must fit x; W even");
    TORCH_CHECK(N * C * H * W < (1LL << 62) && H < (1LL << 31) && W < (1LL << 31), "densenet_transition: too large");
    const float* xp = tr_param(x, x, N * C * H * W, "x");
    const float* mp = tr_param(mean, x, C, "running_mean");
    const float* vp = tr_param(var, x, C, "running_var");
    const float* gp = tr_param(gamma, x, C, "weight");
    const float* bp = tr_param(beta, x, C, "bias");
    const float* wp = tr_param(w, x, O * C, "conv weight");
    auto y = torch::empty({N, O, H / 2, W / 2}, x.options());
    launch_densenet_transition(xp, mp, vp, gp, bp, static_cast<float>(eps), wp, y.data_ptr<float>(),
                               static_cast<int>(N), static_cast<int>(C), static_cast<int>(O), static_cast<int>(H),
                               static_cast<int>(W), reinterpret_cast<void*>(stream));
    return y;
}
