// Defined in the CUDA source (bench/tc_fp32/transition.cu).
void launch_densenet_transition(const float* x, const float* mean, const float* var, const float* gamma,
                                const float* beta, float eps, const float* w, float* y, int N, int cin, int cout,
                                int H, int W, void* stream);

// AvgPool2d(2)(conv1x1(relu(batchnorm(x)))) with BatchNorm's running statistics (inference).
torch::Tensor densenet_transition(torch::Tensor x, torch::Tensor mean, torch::Tensor var, torch::Tensor gamma,
                                  torch::Tensor beta, double eps, torch::Tensor w, int64_t stream) {
    TORCH_CHECK(x.dim() == 4 && w.dim() == 4 && w.size(2) == 1 && w.size(3) == 1, "densenet_transition: shapes");
    x = x.contiguous();
    const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), O = w.size(0);
    TORCH_CHECK(w.size(1) == C && W % 2 == 0 && H >= 2, "densenet_transition: the weight must fit x; W even");
    TORCH_CHECK(N * C * H * W < (1LL << 62) && H < (1LL << 31) && W < (1LL << 31), "densenet_transition: too large");
    const float* xp = f32_arg(x, x, "densenet_transition: x", N * C * H * W);
    const float* mp = f32_arg(mean, x, "densenet_transition: running_mean", C);
    const float* vp = f32_arg(var, x, "densenet_transition: running_var", C);
    const float* gp = f32_arg(gamma, x, "densenet_transition: weight", C);
    const float* bp = f32_arg(beta, x, "densenet_transition: bias", C);
    const float* wp = f32_arg(w, x, "densenet_transition: conv weight", O * C);
    auto y = torch::empty({N, O, H / 2, W / 2}, x.options());
    launch_densenet_transition(xp, mp, vp, gp, bp, static_cast<float>(eps), wp, y.data_ptr<float>(),
                               static_cast<int>(N), static_cast<int>(C), static_cast<int>(O), static_cast<int>(H),
                               static_cast<int>(W), reinterpret_cast<void*>(stream));
    return y;
}
