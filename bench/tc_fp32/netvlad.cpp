// Defined in the CUDA source (bench/tc_fp32/netvlad.cu).
void launch_netvlad(const float* x, const float* clusters, const float* mean, const float* var, const float* gamma,
                    const float* beta, float eps, const float* clusters2, float* out, int B, int N, int KG,
                    void* stream);

namespace {
const float* nv_param(const torch::Tensor& t, const torch::Tensor& x, int64_t numel, const char* what) {
    TORCH_CHECK(t.is_cuda() && t.device() == x.device() && t.scalar_type() == torch::kFloat32 && t.is_contiguous(),
                "netvlad: ", what, " must be a contiguous float32 tensor on the input's device");
    TORCH_CHECK(t.numel() == numel, "netvlad: ", what, " must hold ", numel, " values");
    return t.data_ptr<float>();
}
}  // namespace

// NetVLAD of x (B, N, 512) with 32 clusters (and 0 or 16 ghost clusters), BatchNorm from its running
// statistics: (B, 512 x 32).
torch::Tensor netvlad(torch::Tensor x, torch::Tensor clusters, torch::Tensor mean, torch::Tensor var,
                      torch::Tensor gamma, torch::Tensor beta, double eps, torch::Tensor clusters2, int64_t stream) {
    TORCH_CHECK(x.dim() == 3 && x.size(2) == 512 && clusters.dim() == 2 && clusters.size(0) == 512,
                "netvlad: x (B, N, 512) and clusters (512, K + G) expected");
    x = x.contiguous();
    const int64_t B = x.size(0), N = x.size(1), KG = clusters.size(1);
    TORCH_CHECK(N > 0 && N <= 1024 && B < (1LL << 31), "netvlad: 1 to 1024 features per element");
    const float* xp = nv_param(x, x, B * N * 512, "x");
    const float* cp = nv_param(clusters, x, 512 * KG, "clusters");
    const float* mp = nv_param(mean, x, KG, "batch_norm.running_mean");
    const float* vp = nv_param(var, x, KG, "batch_norm.running_var");
    const float* gp = nv_param(gamma, x, KG, "batch_norm.weight");
    const float* bp = nv_param(beta, x, KG, "batch_norm.bias");
    const float* c2 = nv_param(clusters2, x, 512 * 32, "clusters2");
    auto out = torch::empty({B, 512 * 32}, x.options());
    launch_netvlad(xp, cp, mp, vp, gp, bp, static_cast<float>(eps), c2, out.data_ptr<float>(), static_cast<int>(B),
                   static_cast<int>(N), static_cast<int>(KG), reinterpret_cast<void*>(stream));
    return out;
}
