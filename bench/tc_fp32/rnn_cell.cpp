// Defined in the CUDA source (bench/tc_fp32/rnn_cell.cu).
void launch_cat_columns(float* dst, const float* a, long long a_cols, const float* b, long long b_cols,
                        long long rows, void* stream);

// cat((a, b), dim 1) of two (rows, *) float32 matrices on one device, by the copy engine.
torch::Tensor cat_columns(torch::Tensor a, torch::Tensor b, int64_t stream) {
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(0) == b.size(0), "cat_columns: two matrices of the same rows");
    a = a.contiguous();
    b = b.contiguous();
    f32_arg(a, a, "cat_columns: a");
    f32_arg(b, a, "cat_columns: b");
    auto y = torch::empty({a.size(0), a.size(1) + b.size(1)}, a.options());
    launch_cat_columns(y.data_ptr<float>(), a.data_ptr<float>(), a.size(1), b.data_ptr<float>(), b.size(1), a.size(0),
                       reinterpret_cast<void*>(stream));
    return y;
}
