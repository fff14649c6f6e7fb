// Defined in the CUDA source (bench/tc_fp32/rnn_sequence.cu).
void launch_rnn_recurrence(const float* P, const float* h0, const float* wh, long long wh_stride, float* hs, int T,
                           int B, void* stream);
void launch_copy_rows(float* dst, const float* src, long long rows, long long width, long long src_stride,
                      void* stream);

// The vanilla RNN over x (T, B, I) from h0 (B, H): out (T, B, O), out_t = h2o(tanh(i2h(cat(x_t, h_{t-1})))).
// i2h's weight (H, I + H) is read as [W_x | W_h]: W_x x for all steps in one GEMM, then the recurrence.
torch::Tensor rnn_sequence(torch::Tensor x, torch::Tensor h0, torch::Tensor wi, torch::Tensor bi, torch::Tensor wo,
                           torch::Tensor bo, int64_t stream) {
    f32_arg(x, x, "rnn_sequence: x");
    f32_arg(h0, x, "rnn_sequence: h0");
    f32_arg(wi, x, "rnn_sequence: i2h.weight");
    f32_arg(bi, x, "rnn_sequence: i2h.bias");
    f32_arg(wo, x, "rnn_sequence: h2o.weight");
    f32_arg(bo, x, "rnn_sequence: h2o.bias");
    TORCH_CHECK(x.dim() == 3 && h0.dim() == 2 && wi.dim() == 2 && wo.dim() == 2, "rnn_sequence: shapes");
    const int64_t T = x.size(0), B = x.size(1), I = x.size(2), H = h0.size(1), O = wo.size(0);
    TORCH_CHECK(H == 256, "rnn_sequence: the recurrence kernel is built for 256 hidden units");
    TORCH_CHECK(h0.size(0) == B && wi.size(0) == H && wi.size(1) == I + H && bi.numel() == H && wo.size(1) == H &&
                bo.numel() == O, "rnn_sequence: the layers must fit x and h0");
    TORCH_CHECK(I % 4 == 0 && T * B < (1LL << 31), "rnn_sequence: I % 4 == 0 and T B rows within int32");
    void* s = reinterpret_cast<void*>(stream);
    auto wx = torch::empty({H, I}, x.options());
    launch_copy_rows(wx.data_ptr<float>(), wi.data_ptr<float>(), H, I, I + H, s);
    auto p = torch::empty({T, B, H}, x.options());
    launch_gemm3x(x.data_ptr<float>(), wx.data_ptr<float>(), p.data_ptr<float>(), static_cast<int>(T * B),
                  static_cast<int>(H), static_cast<int>(I), bi.data_ptr<float>(), nullptr, 0.0f, 0.0f, 0.0f, s);
    auto hs = torch::empty({T, B, H}, x.options());
    launch_rnn_recurrence(p.data_ptr<float>(), h0.data_ptr<float>(), wi.data_ptr<float>() + I, I + H,
                          hs.data_ptr<float>(), static_cast<int>(T), static_cast<int>(B), s);
    auto out = torch::empty({T, B, O}, x.options());
    launch_gemm3x(hs.data_ptr<float>(), wo.data_ptr<float>(), out.data_ptr<float>(), static_cast<int>(T * B),
                  static_cast<int>(O), static_cast<int>(H), bo.data_ptr<float>(), nullptr, 0.0f, 0.0f, 0.0f, s);
    return out;
}
