// The vanilla RNN cell's concatenation cat((x, h), dim 1) without a kernel: two strided copies on the
// copy engine into one (rows, a_cols + b_cols) buffer, which i2h then multiplies on the GEMM core.

#include <cuda_runtime.h>

void launch_cat_columns(float* dst, const float* a, long long a_cols, const float* b, long long b_cols,
                        long long rows, void* stream) {
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    const size_t pitch = static_cast<size_t>(a_cols + b_cols) * sizeof(float);
    mc_check(cudaMemcpy2DAsync(dst, pitch, a, a_cols * sizeof(float), a_cols * sizeof(float), rows,
                               cudaMemcpyDeviceToDevice, s), "cat_columns");
    mc_check(cudaMemcpy2DAsync(dst + a_cols, pitch, b, b_cols * sizeof(float), b_cols * sizeof(float), rows,
                               cudaMemcpyDeviceToDevice, s), "cat_columns");
}
