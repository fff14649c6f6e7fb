// Defined in the CUDA source (bench/tc_fp32/netvlad.cu).
void launch_netvlad(const float* x, const float* clusters, const float* mean, const float* var, const float* gamma,
                    const float* beta, float eps, const float* clusters2, float* out, int B, int N, int KG,
                    void* stream);

// NetVLAD of x (B, N, 512) with 32 clusters (and 0 or 16 ghost clusters), BatchNorm from its running
// statistics: (B, 512 x 32).
torch::Tensor netvlad(torch::Tensor x, torch::Tensor clusters, torch::Tensor mean, torch::Tensor var,
                      torch::Tensor gamma, torch::Tensor beta, double eps, torch::Tensor clusters2, int64_t stream) {
    TORCH_CHECK(x.dim() == 3 && x.size(2) == 512 && clusters.dim() == 2 && clusters.size(0) == 512,
                "netvlad: x (B, N, 512) and clusters (512, K + G) expected");
    x = x.contiguous();
    const int64_t B = x.size(0), N = x.size(1), KG = clusters.size(1);
    TORCH_CHECK(N > 0 && N <= 1024 && B < (1LL << 31), "netvlad: 1 to 1024 features per element");
    const float* xp = f32_arg(x, x, "netvlad: x", B * N * 512);
    const float* cp = f32_arg(clusters, x, "netvlad: clusters", 512 * KG);
    const float* mp = f32_arg(mean, x, "netvlad: batch_norm.running_mean", KG);
    const float* vp = f32_arg(var, x, "netvlad: batch_norm.running_var", KG);
    const float* gp = f32_arg(gamma, x, "netvlad: batch_norm.weight", KG);
    const float* bp = f32_arg(beta, x, "netvlad: batch_norm.bias", KG);
    const float* c2 = f32_arg(clusters2, x, "netvlad: clusters2", 512 * 32);
    auto out = torch::empty({B, 512 * 32}, x.options());
    launch_netvlad(xp, cp, mp, vp, gp, bp, static_cast<float>(eps), c2, out.data_ptr<float>(), static_cast<int>(B),
                   static_cast<int>(N), static_cast<int>(KG), reinterpret_cast<void*>(stream));
    return out;
}
