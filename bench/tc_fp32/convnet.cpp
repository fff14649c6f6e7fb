// Defined in the CUDA source (bench/tc_fp32/convnet.cu).
void launch_unfold(const float* in, float* cols, int N, int C, int H, int W, int OH, int OW, int KH, int KW,
                   int stride, int pad, int Kp, long long sn, long long sc, long long sy, long long sx, void* stream);
void launch_conv_weights(const float* w, float* out, int O, int C, int KH, int KW, int Kp, void* stream);
void launch_maxpool_nhwc(const float* in, float* out, int N, int H, int W, int C, int k, int s, int pad, int OH,
                         int OW, void* stream);
void launch_nhwc_flatten(const float* in, float* out, int N, int H, int W, int C, void* stream);
void launch_nchw_to_nhwc(const float* in, float* out, int N, int C, int HW, void* stream);
void launch_concat_to_nchw(const float* const* src, const long long* stride, const int* first, int parts, float* out,
                           int N, int C, int HW, void* stream);
void launch_copy(float* dst, const float* src, long long count, void* stream);

// conv2d(x, w, stride, padding) + b, ReLU'd where relu, as (N, OH, OW, O), over x's channels [c0, c0 + C)
// (C: the weight's): x is (N, C', H, W), or (N, H, W, C') where channels_last. Unfolded into rows and
// multiplied on the 3xTF32 core, bias and ReLU in its epilogue; a 1 x 1 convolution of a whole
// channels-last input is that product directly, without the unfold.
torch::Tensor conv2d(torch::Tensor x, torch::Tensor w, torch::Tensor b, int64_t stride, int64_t pad, bool relu,
                     bool channels_last, int64_t c0, int64_t stream) {
    f32_arg(x, x, "conv2d: x");
    f32_arg(w, x, "conv2d: weight");
    f32_arg(b, x, "conv2d: bias");
    TORCH_CHECK(x.dim() == 4 && w.dim() == 4 && stride > 0 && pad >= 0 && c0 >= 0,
                "conv2d: a 2-d convolution's shapes");
    const int64_t N = x.size(0), Cx = channels_last ? x.size(3) : x.size(1);
    const int64_t H = channels_last ? x.size(1) : x.size(2), W = channels_last ? x.size(2) : x.size(3);
    const int64_t O = w.size(0), C = w.size(1), KH = w.size(2), KW = w.size(3);
    TORCH_CHECK(c0 + C <= Cx && b.numel() == O, "conv2d: the weight's channels and the bias must fit x");
    const int64_t OH = (H + 2 * pad - KH) / stride + 1, OW = (W + 2 * pad - KW) / stride + 1;
    TORCH_CHECK(OH > 0 && OW > 0, "conv2d: the kernel is larger than the padded input");
    const int64_t M = N * OH * OW;
    auto y = torch::empty({N, OH, OW, O}, x.options());
    void* s = reinterpret_cast<void*>(stream);
    const float flag = relu ? 1.0f : 0.0f;
    if (KH == 1 && KW == 1 && stride == 1 && pad == 0 && channels_last && c0 == 0 && C == Cx && C % 4 == 0) {
        launch_gemm3x(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), i32(M, "conv2d: N H W"),
                      i32(O, "conv2d: O"), i32(C, "conv2d: C"), b.data_ptr<float>(), nullptr, flag, 0.0f, 0.0f, s);
        return y;
    }
    const int64_t Kp = (KH * KW * C + 3) / 4 * 4;
    const long long sn = Cx * H * W, sc = channels_last ? 1 : H * W, sy = channels_last ? W * Cx : W,
                    sx = channels_last ? Cx : 1;
    auto cols = torch::empty({M, Kp}, x.options());
    auto wk = torch::empty({O, Kp}, x.options());
    launch_unfold(x.data_ptr<float>() + c0 * sc, cols.data_ptr<float>(), i32(N, "conv2d: N"), i32(C, "conv2d: C"),
                  i32(H, "conv2d: H"), i32(W, "conv2d: W"), i32(OH, "conv2d: OH"), i32(OW, "conv2d: OW"),
                  i32(KH, "conv2d: KH"), i32(KW, "conv2d: KW"), i32(stride, "conv2d: stride"), i32(pad, "conv2d: pad"),
                  i32(Kp, "conv2d: K"), sn, sc, sy, sx, s);
    launch_conv_weights(w.data_ptr<float>(), wk.data_ptr<float>(), i32(O, "conv2d: O"), i32(C, "conv2d: C"),
                        i32(KH, "conv2d: KH"), i32(KW, "conv2d: KW"), i32(Kp, "conv2d: K"), s);
    launch_gemm3x(cols.data_ptr<float>(), wk.data_ptr<float>(), y.data_ptr<float>(), i32(M, "conv2d: N OH OW"),
                  i32(O, "conv2d: O"), i32(Kp, "conv2d: K"), b.data_ptr<float>(), nullptr, flag, 0.0f, 0.0f, s);
    return y;
}

// Three 1 x 1 convolutions of one channels-last input as one product: their weights and biases side by
// side (copied into one buffer), so the input is read once; (N, H, W, O_a + O_b + O_c).
torch::Tensor conv1x1_three(torch::Tensor x, torch::Tensor wa, torch::Tensor ba, torch::Tensor wb, torch::Tensor bb,
                            torch::Tensor wc, torch::Tensor bc, int64_t stream) {
    f32_arg(x, x, "conv1x1_three: x");
    TORCH_CHECK(x.dim() == 4 && x.size(3) % 4 == 0, "conv1x1_three: x must be (N, H, W, C), C % 4 == 0");
    const int64_t C = x.size(3), M = x.size(0) * x.size(1) * x.size(2);
    const torch::Tensor ws[3] = {wa, wb, wc}, bs[3] = {ba, bb, bc};
    int64_t O = 0;
    for (int i = 0; i < 3; ++i) {
        f32_arg(ws[i], x, "conv1x1_three: a weight");
        f32_arg(bs[i], x, "conv1x1_three: a bias");
        TORCH_CHECK(ws[i].dim() == 4 && ws[i].size(1) == C && ws[i].size(2) == 1 && ws[i].size(3) == 1 &&
                    bs[i].numel() == ws[i].size(0), "conv1x1_three: 1 x 1 kernels over x's channels");
        O += ws[i].size(0);
    }
    auto w = torch::empty({O, C}, x.options());
    auto b = torch::empty({O}, x.options());
    int64_t row = 0;
    for (int i = 0; i < 3; ++i) {
        const int64_t o = ws[i].size(0);
        launch_copy(w.data_ptr<float>() + row * C, ws[i].data_ptr<float>(), o * C, reinterpret_cast<void*>(stream));
        launch_copy(b.data_ptr<float>() + row, bs[i].data_ptr<float>(), o, reinterpret_cast<void*>(stream));
        row += o;
    }
    auto y = torch::empty({x.size(0), x.size(1), x.size(2), O}, x.options());
    launch_gemm3x(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), i32(M, "conv1x1_three: N H W"),
                  i32(O, "conv1x1_three: O"), i32(C, "conv1x1_three: C"), b.data_ptr<float>(), nullptr, 0.0f, 0.0f,
                  0.0f, reinterpret_cast<void*>(stream));
    return y;
}

// k x k max pooling at stride s, padded by pad, channels-last.
torch::Tensor maxpool_nhwc(torch::Tensor x, int64_t k, int64_t s, int64_t pad, int64_t stream) {
    f32_arg(x, x, "maxpool_nhwc: x");
    TORCH_CHECK(x.dim() == 4 && k > 0 && s > 0 && pad >= 0 && 2 * pad <= k && x.size(1) + 2 * pad >= k &&
                x.size(2) + 2 * pad >= k, "maxpool_nhwc: x must be (N, H, W, C), the window within the padded input");
    const int64_t OH = (x.size(1) + 2 * pad - k) / s + 1, OW = (x.size(2) + 2 * pad - k) / s + 1;
    auto y = torch::empty({x.size(0), OH, OW, x.size(3)}, x.options());
    launch_maxpool_nhwc(x.data_ptr<float>(), y.data_ptr<float>(), i32(x.size(0), "N"), i32(x.size(1), "H"),
                        i32(x.size(2), "W"), i32(x.size(3), "C"), i32(k, "k"), i32(s, "s"), i32(pad, "pad"),
                        i32(OH, "OH"), i32(OW, "OW"), reinterpret_cast<void*>(stream));
    return y;
}

torch::Tensor nhwc_flatten(torch::Tensor x, int64_t stream) {
    f32_arg(x, x, "nhwc_flatten: x");
    TORCH_CHECK(x.dim() == 4, "nhwc_flatten: x must be (N, H, W, C)");
    auto y = torch::empty({x.size(0), x.size(1) * x.size(2) * x.size(3)}, x.options());
    launch_nhwc_flatten(x.data_ptr<float>(), y.data_ptr<float>(), i32(x.size(0), "N"), i32(x.size(1), "H"),
                        i32(x.size(2), "W"), i32(x.size(3), "C"), reinterpret_cast<void*>(stream));
    return y;
}

torch::Tensor nchw_to_nhwc(torch::Tensor x, int64_t stream) {
    f32_arg(x, x, "nchw_to_nhwc: x");
    TORCH_CHECK(x.dim() == 4, "nchw_to_nhwc: x must be (N, C, H, W)");
    auto y = torch::empty({x.size(0), x.size(2), x.size(3), x.size(1)}, x.options());
    launch_nchw_to_nhwc(x.data_ptr<float>(), y.data_ptr<float>(), i32(x.size(0), "N"), i32(x.size(1), "C"),
                        i32(x.size(2) * x.size(3), "H W"), reinterpret_cast<void*>(stream));
    return y;
}

// Four channels-last parts side by side along channels as one (N, C, H, W): part i is channels
// [f_i, f_i + n_i) of t_i (N, H, W, C_i).
torch::Tensor concat_to_nchw(torch::Tensor t0, int64_t f0, int64_t n0, torch::Tensor t1, int64_t f1, int64_t n1,
                             torch::Tensor t2, int64_t f2, int64_t n2, torch::Tensor t3, int64_t f3, int64_t n3,
                             int64_t stream) {
    const torch::Tensor ts[4] = {t0, t1, t2, t3};
    const int64_t fs[4] = {f0, f1, f2, f3}, ns[4] = {n0, n1, n2, n3};
    const float* src[4];
    long long stride[4];
    int first[5] = {0, 0, 0, 0, 0};
    for (int i = 0; i < 4; ++i) {
        f32_arg(ts[i], t0, "concat_to_nchw: a part");
        TORCH_CHECK(ts[i].dim() == 4 && ts[i].size(0) == t0.size(0) && ts[i].size(1) == t0.size(1) &&
                    ts[i].size(2) == t0.size(2), "concat_to_nchw: the parts must be (N, H, W, C_i) of one N, H, W");
        TORCH_CHECK(fs[i] >= 0 && ns[i] > 0 && fs[i] + ns[i] <= ts[i].size(3), "concat_to_nchw: channels out of range");
        src[i] = ts[i].data_ptr<float>() + fs[i];
        stride[i] = ts[i].size(3);
        first[i + 1] = first[i] + i32(ns[i], "concat_to_nchw: channels");
    }
    auto y = torch::empty({t0.size(0), first[4], t0.size(1), t0.size(2)}, t0.options());
    launch_concat_to_nchw(src, stride, first, 4, y.data_ptr<float>(), i32(t0.size(0), "N"), first[4],
                          i32(t0.size(1) * t0.size(2), "H W"), reinterpret_cast<void*>(stream));
    return y;
}
