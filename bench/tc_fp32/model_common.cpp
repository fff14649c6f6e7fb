// What every model's C++ wrappers share (the renderer puts this first): their arguments' checks.
namespace {
// t's float32 data, once t is known to be a contiguous float32 tensor on like's CUDA device holding numel
// values (any number where numel < 0); `what` names the argument in the error.
const float* f32_arg(const torch::Tensor& t, const torch::Tensor& like, const char* what, int64_t numel = -1) {
    TORCH_CHECK(t.is_cuda() && t.device() == like.device() && t.scalar_type() == torch::kFloat32 && t.is_contiguous(),
                what, " must be a contiguous float32 tensor on the input's CUDA device");
    TORCH_CHECK(numel < 0 || t.numel() == numel, what, " must hold ", numel, " values");
    return t.data_ptr<float>();
}

int32_t i32(int64_t v, const char* what) {
    TORCH_CHECK(v >= 0 && v < (1LL << 31), what, " must fit int32");
    return static_cast<int32_t>(v);
}
}  // namespace
