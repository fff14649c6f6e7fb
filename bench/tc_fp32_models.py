"""Whole-model solutions of level 3 on the strict-FP32 tensor-core kernels: every op of the model in a
kernel of our own, written from the GEMM core (bench/tc_fp32/gemm_core.cu) and the model's own kernels
beside it in bench/tc_fp32 (an attention core, ...).

Each solution is one self-contained candidate file under bench/kernelbench_solutions/fp32_tc_models,
named as its KernelBench problem; bench/tc_fp32_sync.py writes them with the level-1/2 ones (and its
`--check` fails on drift). This module only renders them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tc_fp32_sync import _HEAD, _LOAD, _METHOD, _SOURCES, EXT_PREFIX, ROOT, VARIANT_MARK, render_cpp, render_cuda

OUT = ROOT / "bench" / "kernelbench_solutions" / "fp32_tc_models"
KERNELS = ROOT / "bench" / "tc_fp32"
_PYBIND = "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"


@dataclass(frozen=True)
class ModelSolution:
    """A level-3 model's solution: the core with a bias epilogue for its Linear layers, and kernels of
    the model's own (a .cu file of bench/tc_fp32 each) with their C++ wrappers."""

    path: str  # relative to OUT, named as the KernelBench problem file
    summary: str  # the docstring's first lines: what the model computes and which kernel does what
    model: str  # the ModelNew class
    kernels: tuple[str, ...] = ()  # file names under bench/tc_fp32, appended to the core in this order
    cpp: str = ""  # the wrappers' C++ (declarations of the launchers and the torch-facing functions)
    binds: tuple[tuple[str, str], ...] = ()  # (function, its description) bound beside gemm3x
    epilogue: str = "return v + __ldg(e.bias + col);"  # the GEMM's, on the biased dot product's terms
    epilogue_note: str = "The bias is added to the accumulators before the only store."
    gemm: bool = True  # the GEMM core is in it (else only the model's own kernels)

    @property
    def ext_name(self) -> str:
        return f"{EXT_PREFIX}{Path(self.path).parent.name}_{Path(self.path).stem.split('_')[0]}"


_RELU_ATTENTION_CPP = r"""
// Defined in the CUDA source (bench/tc_fp32/relu_attention.cu).
void launch_relu_attention(const float* qkv, float* y, int B, int T, int C, int H, float scale, void* stream);

torch::Tensor relu_attention(torch::Tensor qkv, int64_t B, int64_t T, int64_t C, int64_t H, double scale,
                             int64_t stream) {
    TORCH_CHECK(qkv.is_cuda() && qkv.scalar_type() == torch::kFloat32 && qkv.is_contiguous(),
                "relu_attention: qkv must be a contiguous float32 CUDA tensor");
    TORCH_CHECK(qkv.numel() == B * T * 3 * C, "relu_attention: qkv must hold B x T x 3C values");
    TORCH_CHECK(H > 0 && C == 64 * H, "relu_attention: the kernel's head size is 64 (C == 64 x n_head)");
    TORCH_CHECK(T % 64 == 0, "relu_attention: the kernel takes sequences of a multiple of 64");
    TORCH_CHECK(B * T < (1LL << 31) / (3 * C), "relu_attention: sizes must fit int32 rows");
    auto y = torch::empty({B, T, C}, qkv.options());
    launch_relu_attention(qkv.data_ptr<float>(), y.data_ptr<float>(), static_cast<int>(B), static_cast<int>(T),
                          static_cast<int>(C), static_cast<int>(H), static_cast<float>(scale),
                          reinterpret_cast<void*>(stream));
    return y;
}
"""

_RELU_ATTENTION_MODEL = '''class ModelNew(nn.Module):
    """Causal ReLU self-attention: c_attn on the 3xTF32 GEMM (bias in its epilogue), then the fused
    attention kernel reading q, k and v in place from its output."""

    def __init__(self, n_embd, n_head, max_seqlen):
        super().__init__()
        # made in the reference's order, with its names: the same seed gives the same values, and its
        # state dict loads by name
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.register_buffer("bias", torch.tril(torch.ones(max_seqlen, max_seqlen))
                             .view(1, 1, max_seqlen, max_seqlen))
        self.n_head = n_head
        self.n_embd = n_embd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        stream = torch.cuda.current_stream(x.device).cuda_stream
        qkv = _ext.gemm3x(x.reshape(B * T, C), self.c_attn.weight, self.c_attn.bias, 0.0, 0.0, 0.0, stream)
        scale = 1.0 / math.sqrt(C // self.n_head)  # the reference's, 1 / sqrt(head size)
        return _ext.relu_attention(qkv, B, T, C, self.n_head, scale, stream)
'''

_VISION_ATTENTION_CPP = r"""
// Defined in the CUDA source (bench/tc_fp32/vision_attention.cu).
void launch_to_tokens(const float* x, float* tokens, int B, int C, int L, void* stream);
void launch_mha_flash(const float* qkv, float* out, int L, int N, int E, int H, float scale, void* stream);
void launch_residual_layernorm(const float* a, const float* x, const float* gamma, const float* beta, float* y, int B,
                               int C, int L, float eps, void* stream);

namespace {
void check_f32(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.is_cuda() && t.scalar_type() == torch::kFloat32 && t.is_contiguous(), what,
                " must be a contiguous float32 CUDA tensor");
}
}  // namespace

torch::Tensor to_tokens(torch::Tensor x, int64_t stream) {
    check_f32(x, "to_tokens: x");
    TORCH_CHECK(x.dim() == 4, "to_tokens: x must be (B, C, H, W)");
    const int64_t B = x.size(0), C = x.size(1), L = x.size(2) * x.size(3);
    TORCH_CHECK(C % 32 == 0 && C <= 256, "to_tokens: the kernel takes 32 to 256 channels, a multiple of 32");
    TORCH_CHECK(B * C * L < (1LL << 31), "to_tokens: sizes must fit int32");
    auto tokens = torch::empty({L * B, C}, x.options());
    launch_to_tokens(x.data_ptr<float>(), tokens.data_ptr<float>(), static_cast<int>(B), static_cast<int>(C),
                     static_cast<int>(L), reinterpret_cast<void*>(stream));
    return tokens;
}

torch::Tensor mha_attention(torch::Tensor qkv, int64_t L, int64_t N, int64_t E, int64_t H, double scale,
                            int64_t stream) {
    check_f32(qkv, "mha_attention: qkv");
    TORCH_CHECK(qkv.numel() == L * N * 3 * E, "mha_attention: qkv must hold L x N x 3E values");
    TORCH_CHECK(H > 0 && E % H == 0 && (E / H == 32 || E / H == 64), "mha_attention: head size 32 or 64");
    TORCH_CHECK(L % 64 == 0, "mha_attention: the kernel takes sequences of a multiple of 64");
    TORCH_CHECK(L * N * 3 * E < (1LL << 31), "mha_attention: sizes must fit int32");
    auto out = torch::empty({L * N, E}, qkv.options());
    launch_mha_flash(qkv.data_ptr<float>(), out.data_ptr<float>(), static_cast<int>(L), static_cast<int>(N),
                     static_cast<int>(E), static_cast<int>(H), static_cast<float>(scale),
                     reinterpret_cast<void*>(stream));
    return out;
}

torch::Tensor residual_layernorm(torch::Tensor a, torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double eps,
                                 int64_t stream) {
    check_f32(a, "residual_layernorm: a");
    check_f32(x, "residual_layernorm: x");
    check_f32(gamma, "residual_layernorm: weight");
    check_f32(beta, "residual_layernorm: bias");
    TORCH_CHECK(x.dim() == 4, "residual_layernorm: x must be (B, C, H, W)");
    const int64_t B = x.size(0), C = x.size(1), L = x.size(2) * x.size(3);
    TORCH_CHECK(C % 32 == 0 && C <= 256, "residual_layernorm: the kernel takes 32 to 256 channels, a multiple of 32");
    TORCH_CHECK(a.numel() == x.numel() && gamma.numel() == C && beta.numel() == C, "residual_layernorm: shapes differ");
    auto y = torch::empty_like(x);
    launch_residual_layernorm(a.data_ptr<float>(), x.data_ptr<float>(), gamma.data_ptr<float>(), beta.data_ptr<float>(),
                              y.data_ptr<float>(), static_cast<int>(B), static_cast<int>(C), static_cast<int>(L),
                              static_cast<float>(eps), reinterpret_cast<void*>(stream));
    return y;
}
"""

_VISION_ATTENTION_MODEL = '''class ModelNew(nn.Module):
    """Self-attention over an image's pixels with a residual LayerNorm: the projections on the 3xTF32 GEMM,
    the heads' softmax attention in one flash kernel, the layouts and the LayerNorm in kernels of their own."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        # the reference's modules, names and order: its state dict loads by name, the same seed gives the same values
        self.attn = nn.MultiheadAttention(embed_dim, num_heads)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        stream = torch.cuda.current_stream(x.device).cuda_stream
        x = x.contiguous()
        attn = self.attn
        tokens = _ext.to_tokens(x, stream)  # (H W B, C): the reference's (seq, batch, embed) as rows
        qkv = _ext.gemm3x(tokens, attn.in_proj_weight, attn.in_proj_bias, 0.0, 0.0, 0.0, stream)
        scale = math.sqrt(1.0 / float(C // attn.num_heads))  # the reference's scaling of q
        heads = _ext.mha_attention(qkv, H * W, B, C, attn.num_heads, scale, stream)
        out = _ext.gemm3x(heads, attn.out_proj.weight, attn.out_proj.bias, 0.0, 0.0, 0.0, stream)
        return _ext.residual_layernorm(out, x, self.norm.weight, self.norm.bias, self.norm.eps, stream)
'''

_LENET_CPP = r"""
// Defined in the CUDA source (bench/tc_fp32/lenet5.cu).
struct LeNetWeights {
    const float* c1w; const float* c1b;
    const float* c2w; const float* c2b;
    const float* f1w; const float* f1b;
    const float* f2w; const float* f2b;
    const float* f3w; const float* f3b;
};
void launch_lenet5(const float* x, const LeNetWeights& p, float* logits, int batch, int classes, void* stream);

namespace {
const float* lenet_param(const torch::Tensor& t, const torch::Tensor& x, int64_t numel, const char* what) {
    TORCH_CHECK(t.is_cuda() && t.device() == x.device() && t.scalar_type() == torch::kFloat32 && t.is_contiguous(),
                "lenet5: ", what, " must be a contiguous float32 tensor on the input's device");
    TORCH_CHECK(t.numel() == numel, "lenet5: ", what, " must hold ", numel, " values (LeNet-5's shapes)");
    return t.data_ptr<float>();
}
}  // namespace

torch::Tensor lenet5(torch::Tensor x, torch::Tensor c1w, torch::Tensor c1b, torch::Tensor c2w, torch::Tensor c2b,
                     torch::Tensor f1w, torch::Tensor f1b, torch::Tensor f2w, torch::Tensor f2b, torch::Tensor f3w,
                     torch::Tensor f3b, int64_t stream) {
    TORCH_CHECK(x.dim() == 4 && x.size(1) == 1 && x.size(2) == 32 && x.size(3) == 32,
                "lenet5: x must be (batch, 1, 32, 32)");
    x = x.contiguous();
    const int64_t batch = x.size(0), classes = f3b.numel();
    TORCH_CHECK(batch < (1LL << 31) / 1024 && classes > 0, "lenet5: batch must fit int32 offsets");
    LeNetWeights p{lenet_param(c1w, x, 150, "conv1.weight"), lenet_param(c1b, x, 6, "conv1.bias"),
                   lenet_param(c2w, x, 2400, "conv2.weight"), lenet_param(c2b, x, 16, "conv2.bias"),
                   lenet_param(f1w, x, 48000, "fc1.weight"), lenet_param(f1b, x, 120, "fc1.bias"),
                   lenet_param(f2w, x, 10080, "fc2.weight"), lenet_param(f2b, x, 84, "fc2.bias"),
                   lenet_param(f3w, x, classes * 84, "fc3.weight"), lenet_param(f3b, x, classes, "fc3.bias")};
    lenet_param(x, x, batch * 1024, "x");
    auto logits = torch::empty({batch, classes}, x.options());
    launch_lenet5(x.data_ptr<float>(), p, logits.data_ptr<float>(), static_cast<int>(batch),
                  static_cast<int>(classes), reinterpret_cast<void*>(stream));
    return logits;
}
"""

_LENET_MODEL = '''class ModelNew(nn.Module):
    """LeNet-5 in one kernel: every layer of a block's images in shared memory."""

    def __init__(self, num_classes):
        super().__init__()
        # the reference's layers, names and order: its state dict loads by name, the same seed gives the same values
        self.conv1 = nn.Conv2d(in_channels=1, out_channels=6, kernel_size=5, stride=1)
        self.conv2 = nn.Conv2d(in_channels=6, out_channels=16, kernel_size=5, stride=1)
        self.fc1 = nn.Linear(in_features=16 * 5 * 5, out_features=120)
        self.fc2 = nn.Linear(in_features=120, out_features=84)
        self.fc3 = nn.Linear(in_features=84, out_features=num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stream = torch.cuda.current_stream(x.device).cuda_stream
        return _ext.lenet5(x, self.conv1.weight, self.conv1.bias, self.conv2.weight, self.conv2.bias,
                           self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias, self.fc3.weight,
                           self.fc3.bias, stream)
'''

_FIRE_CPP = r"""
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
"""

_FIRE_MODEL = '''class ModelNew(nn.Module):
    """The Fire module in one kernel: squeeze over a tile and its halo in shared memory, both expands and
    the concatenation written once per output value."""

    def __init__(self, in_channels, squeeze_channels, expand1x1_channels, expand3x3_channels):
        super().__init__()
        # the reference's layers, names and order: its state dict loads by name, the same seed gives the same values
        self.squeeze = nn.Conv2d(in_channels, squeeze_channels, kernel_size=1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze_channels, expand1x1_channels, kernel_size=1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze_channels, expand3x3_channels, kernel_size=3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stream = torch.cuda.current_stream(x.device).cuda_stream
        return _ext.fire_module(x, self.squeeze.weight, self.squeeze.bias, self.expand1x1.weight,
                                self.expand1x1.bias, self.expand3x3.weight, self.expand3x3.bias, stream)
'''

_CONVNET_CPP = r"""
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

namespace {
void check_cn(const torch::Tensor& t, const torch::Tensor& like, const char* what) {
    TORCH_CHECK(t.is_cuda() && t.device() == like.device() && t.scalar_type() == torch::kFloat32 && t.is_contiguous(),
                what, " must be a contiguous float32 tensor on the input's device");
}

int32_t i32(int64_t v, const char* what) {
    TORCH_CHECK(v >= 0 && v < (1LL << 31), what, " must fit int32");
    return static_cast<int32_t>(v);
}
}  // namespace

// conv2d(x, w, stride, padding) + b, ReLU'd where relu, as (N, OH, OW, O), over x's channels [c0, c0 + C)
// (C: the weight's): x is (N, C', H, W), or (N, H, W, C') where channels_last. Unfolded into rows and
// multiplied on the 3xTF32 core, bias and ReLU in its epilogue; a 1 x 1 convolution of a whole
// channels-last input is that product directly, without the unfold.
torch::Tensor conv2d(torch::Tensor x, torch::Tensor w, torch::Tensor b, int64_t stride, int64_t pad, bool relu,
                     bool channels_last, int64_t c0, int64_t stream) {
    check_cn(x, x, "conv2d: x");
    check_cn(w, x, "conv2d: weight");
    check_cn(b, x, "conv2d: bias");
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
    check_cn(x, x, "conv1x1_three: x");
    TORCH_CHECK(x.dim() == 4 && x.size(3) % 4 == 0, "conv1x1_three: x must be (N, H, W, C), C % 4 == 0");
    const int64_t C = x.size(3), M = x.size(0) * x.size(1) * x.size(2);
    const torch::Tensor ws[3] = {wa, wb, wc}, bs[3] = {ba, bb, bc};
    int64_t O = 0;
    for (int i = 0; i < 3; ++i) {
        check_cn(ws[i], x, "conv1x1_three: a weight");
        check_cn(bs[i], x, "conv1x1_three: a bias");
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
    check_cn(x, x, "maxpool_nhwc: x");
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
    check_cn(x, x, "nhwc_flatten: x");
    TORCH_CHECK(x.dim() == 4, "nhwc_flatten: x must be (N, H, W, C)");
    auto y = torch::empty({x.size(0), x.size(1) * x.size(2) * x.size(3)}, x.options());
    launch_nhwc_flatten(x.data_ptr<float>(), y.data_ptr<float>(), i32(x.size(0), "N"), i32(x.size(1), "H"),
                        i32(x.size(2), "W"), i32(x.size(3), "C"), reinterpret_cast<void*>(stream));
    return y;
}

torch::Tensor nchw_to_nhwc(torch::Tensor x, int64_t stream) {
    check_cn(x, x, "nchw_to_nhwc: x");
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
        check_cn(ts[i], t0, "concat_to_nchw: a part");
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
"""

_CONVNET_BINDS = (("conv2d", "conv2d + bias (ReLU'd or not), unfolded onto the 3xTF32 GEMM, channels-last out"),
                  ("conv1x1_three", "three 1 x 1 convolutions of one channels-last input as one product"),
                  ("maxpool_nhwc", "k x k max pooling at stride s with padding, channels-last"),
                  ("nhwc_flatten", "channels-last to the reference's flatten order"),
                  ("nchw_to_nhwc", "channels-first to channels-last"),
                  ("concat_to_nchw", "four channels-last parts side by side as one channels-first tensor"))


def _vgg_model(name: str, cfg: str) -> str:
    return f'''# The reference's feature layers: a number is a 3 x 3 convolution (padding 1) to that many channels and
# its ReLU, "M" a 2 x 2 max pooling.
CFG: list[int | str] = {cfg}


class ModelNew(nn.Module):
    """{name}: each convolution unfolded and multiplied on the 3xTF32 GEMM with its bias and ReLU,
    channels-last throughout; the classifier's Linear layers on the GEMM."""

    def __init__(self, num_classes=1000):
        super().__init__()
        # the reference's layers, names and order: its state dict loads by name, the same seed gives the same values
        layers: list[nn.Module] = []
        channels = 3
        for v in CFG:
            if isinstance(v, str):  # "M"
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(channels, v, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                channels = v
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=0.0),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=0.0),
            nn.Linear(4096, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stream = torch.cuda.current_stream(x.device).cuda_stream
        h = x.contiguous()
        channels_last = False  # the input is (N, C, H, W); every convolution's output (N, H, W, C)
        for layer in self.features:
            if isinstance(layer, nn.Conv2d):
                h = _ext.conv2d(h, layer.weight, layer.bias, 1, 1, True, channels_last, 0, stream)
                channels_last = True
            elif isinstance(layer, nn.MaxPool2d):
                h = _ext.maxpool_nhwc(h, 2, 2, 0, stream)
        h = _ext.nhwc_flatten(h, stream)
        linears = [m for m in self.classifier if isinstance(m, nn.Linear)]
        for i, layer in enumerate(linears):
            relu = 1.0 if i < len(linears) - 1 else 0.0
            h = _ext.gemm3x(h, layer.weight, layer.bias, relu, 0.0, 0.0, stream)
        return h
'''


_ALEXNET_MODEL = '''class ModelNew(nn.Module):
    """AlexNet: each convolution unfolded and multiplied on the 3xTF32 GEMM with its bias and ReLU,
    channels-last throughout; the classifier's Linear layers on the GEMM."""

    def __init__(self, num_classes=1000):
        super().__init__()
        # the reference's layers, names and order: its state dict loads by name, the same seed gives the same values
        self.conv1 = nn.Conv2d(in_channels=3, out_channels=96, kernel_size=11, stride=4, padding=2)
        self.relu1 = nn.ReLU(inplace=True)
        self.maxpool1 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.conv2 = nn.Conv2d(in_channels=96, out_channels=256, kernel_size=5, padding=2)
        self.relu2 = nn.ReLU(inplace=True)
        self.maxpool2 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.conv3 = nn.Conv2d(in_channels=256, out_channels=384, kernel_size=3, padding=1)
        self.relu3 = nn.ReLU(inplace=True)
        self.conv4 = nn.Conv2d(in_channels=384, out_channels=384, kernel_size=3, padding=1)
        self.relu4 = nn.ReLU(inplace=True)
        self.conv5 = nn.Conv2d(in_channels=384, out_channels=256, kernel_size=3, padding=1)
        self.relu5 = nn.ReLU(inplace=True)
        self.maxpool3 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.fc1 = nn.Linear(in_features=256 * 6 * 6, out_features=4096)
        self.relu6 = nn.ReLU(inplace=True)
        self.dropout1 = nn.Dropout(p=0.0)
        self.fc2 = nn.Linear(in_features=4096, out_features=4096)
        self.relu7 = nn.ReLU(inplace=True)
        self.dropout2 = nn.Dropout(p=0.0)
        self.fc3 = nn.Linear(in_features=4096, out_features=num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stream = torch.cuda.current_stream(x.device).cuda_stream
        h = x.contiguous()
        channels_last = False  # the input is (N, C, H, W); every convolution's output (N, H, W, C)
        for conv, pool in ((self.conv1, self.maxpool1), (self.conv2, self.maxpool2), (self.conv3, None),
                           (self.conv4, None), (self.conv5, self.maxpool3)):
            h = _ext.conv2d(h, conv.weight, conv.bias, conv.stride[0], conv.padding[0], True, channels_last, 0, stream)
            channels_last = True
            if pool is not None:
                h = _ext.maxpool_nhwc(h, pool.kernel_size, pool.stride, 0, stream)
        h = _ext.nhwc_flatten(h, stream)
        h = _ext.gemm3x(h, self.fc1.weight, self.fc1.bias, 1.0, 0.0, 0.0, stream)
        h = _ext.gemm3x(h, self.fc2.weight, self.fc2.bias, 1.0, 0.0, 0.0, stream)
        return _ext.gemm3x(h, self.fc3.weight, self.fc3.bias, 0.0, 0.0, 0.0, stream)
'''

_INCEPTION_MODEL = '''class ModelNew(nn.Module):
    """The Inception module channels-last: the three 1 x 1 convolutions of x as one product, the 3 x 3 and
    5 x 5 ones unfolded from its channels, the pooling branch's max pooling and 1 x 1 product, and the
    concatenation written once, channels-first, by a kernel of its own."""

    def __init__(self, in_channels, out_1x1, reduce_3x3, out_3x3, reduce_5x5, out_5x5, pool_proj):
        super().__init__()
        # the reference's layers, names and order: its state dict loads by name, the same seed gives the same values
        self.branch1x1 = nn.Conv2d(in_channels, out_1x1, kernel_size=1)
        self.branch3x3 = nn.Sequential(
            nn.Conv2d(in_channels, reduce_3x3, kernel_size=1),
            nn.Conv2d(reduce_3x3, out_3x3, kernel_size=3, padding=1)
        )
        self.branch5x5 = nn.Sequential(
            nn.Conv2d(in_channels, reduce_5x5, kernel_size=1),
            nn.Conv2d(reduce_5x5, out_5x5, kernel_size=5, padding=2)
        )
        self.branch_pool = nn.Sequential(
            nn.MaxPool2d(kernel_size=3, stride=1, padding=1),
            nn.Conv2d(in_channels, pool_proj, kernel_size=1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stream = torch.cuda.current_stream(x.device).cuda_stream
        xl = _ext.nchw_to_nhwc(x.contiguous(), stream)  # (N, H, W, C)
        one, r3, c3 = self.branch1x1, self.branch3x3[0], self.branch3x3[1]
        r5, c5, proj = self.branch5x5[0], self.branch5x5[1], self.branch_pool[1]
        assert isinstance(r3, nn.Conv2d) and isinstance(c3, nn.Conv2d) and isinstance(r5, nn.Conv2d)
        assert isinstance(c5, nn.Conv2d) and isinstance(proj, nn.Conv2d)
        # (N, H, W, out_1x1 + reduce_3x3 + reduce_5x5): the three 1 x 1 convolutions of x
        ones = _ext.conv1x1_three(xl, one.weight, one.bias, r3.weight, r3.bias, r5.weight, r5.bias, stream)
        o1, o3 = one.out_channels, r3.out_channels
        b3 = _ext.conv2d(ones, c3.weight, c3.bias, 1, 1, False, True, o1, stream)
        b5 = _ext.conv2d(ones, c5.weight, c5.bias, 1, 2, False, True, o1 + o3, stream)
        pooled = _ext.maxpool_nhwc(xl, 3, 1, 1, stream)
        bp = _ext.conv2d(pooled, proj.weight, proj.bias, 1, 0, False, True, 0, stream)
        return _ext.concat_to_nchw(ones, 0, o1, b3, 0, c3.out_channels, b5, 0, c5.out_channels, bp, 0,
                                   proj.out_channels, stream)
'''

_VGG_SUMMARY = ("{name} (batch 10, 224 x 224): each 3 x 3 convolution unfolded into rows and multiplied on the 3xTF32\n"
                "wgmma GEMM with its bias and ReLU in the epilogue, the activations channels-last throughout\n"
                "(bench/tc_fp32/convnet.cu: the unfold, the weights' layout, the pooling, the flatten); the\n"
                "classifier's Linear layers on the same GEMM.")
_VGG16 = '[64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]'
_VGG19 = ('[64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",\n'
          '                        512, 512, 512, 512, "M"]')

# The MLPs' Linear layers: the bias, then ReLU where p0 is 1 (every layer but the last).
_BIAS_RELU = ("const float x = v + __ldg(e.bias + col);\n"
              "    return e.p0 != 0.0f && x < 0.0f ? 0.0f : x;  // NaN stays NaN")
_BIAS_RELU_NOTE = ("The bias, and ReLU where the call asks for it (p0 1: every layer but the last), are applied\n"
                   "to the accumulators before the only store.")
_BIAS_TANH = "const float x = v + __ldg(e.bias + col);\n    return e.p0 != 0.0f ? tanhf(x) : x;"
_BIAS_TANH_NOTE = ("The bias, and tanh where the call asks for it (p0 1: i2h), are applied to the accumulators\n"
                   "before the only store.")
_MLP_SUMMARY = ("a multi-layer perceptron, Linear and ReLU in turn: each Linear on the 3xTF32 wgmma GEMM with its\n"
                "bias and the ReLU after it in the epilogue, one kernel per layer.")


def _mlp_model(sizes: str) -> str:
    return f'''class ModelNew(nn.Module):
    """Linear and ReLU in turn, each Linear one GEMM with its bias and ReLU in the epilogue."""

    def __init__(self, input_size, {sizes}, output_size):
        super().__init__()
        # the reference's layers, names and order: its state dict loads by name, the same seed gives the same values
        layers: list[nn.Module] = []
        current_input_size = input_size
        for size in {sizes}:
            layers.append(nn.Linear(current_input_size, size))
            layers.append(nn.ReLU())
            current_input_size = size
        layers.append(nn.Linear(current_input_size, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stream = torch.cuda.current_stream(x.device).cuda_stream
        linears = [m for m in self.network if isinstance(m, nn.Linear)]
        for i, layer in enumerate(linears):
            relu = 1.0 if i < len(linears) - 1 else 0.0
            x = _ext.gemm3x(x, layer.weight, layer.bias, relu, 0.0, 0.0, stream)
        return x
'''


_TRANSITION_CPP = r"""
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
"""

_TRANSITION_MODEL = '''class ModelNew(nn.Module):
    """DenseNet's transition layer in one kernel: BatchNorm (running statistics), ReLU and the average
    pooling per input channel, then the 1 x 1 convolution on the pooled pixels."""

    def __init__(self, num_input_features: int, num_output_features: int):
        super().__init__()
        # the reference's layers, names and order: its state dict loads by name, the same seed gives the same values
        self.transition = nn.Sequential(
            nn.BatchNorm2d(num_input_features),
            nn.ReLU(inplace=True),
            nn.Conv2d(num_input_features, num_output_features, kernel_size=1, bias=False),
            nn.AvgPool2d(kernel_size=2, stride=2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:  # BatchNorm from the batch's own statistics is not what the kernel computes
            raise RuntimeError("this kernel computes inference BatchNorm (running statistics): call .eval() first")
        bn, conv = self.transition[0], self.transition[2]
        assert isinstance(bn, nn.BatchNorm2d) and isinstance(conv, nn.Conv2d)
        assert bn.running_mean is not None and bn.running_var is not None
        stream = torch.cuda.current_stream(x.device).cuda_stream
        return _ext.densenet_transition(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, bn.eps, conv.weight,
                                        stream)
'''

_RNN_CPP = r"""
// Defined in the CUDA source (bench/tc_fp32/rnn_cell.cu).
void launch_cat_columns(float* dst, const float* a, long long a_cols, const float* b, long long b_cols,
                        long long rows, void* stream);

// cat((a, b), dim 1) of two (rows, *) float32 matrices on one device, by the copy engine.
torch::Tensor cat_columns(torch::Tensor a, torch::Tensor b, int64_t stream) {
    TORCH_CHECK(a.is_cuda() && b.device() == a.device() && a.scalar_type() == torch::kFloat32 &&
                b.scalar_type() == torch::kFloat32 && a.dim() == 2 && b.dim() == 2 && a.size(0) == b.size(0),
                "cat_columns: two float32 matrices of the same rows on one CUDA device");
    a = a.contiguous();
    b = b.contiguous();
    auto y = torch::empty({a.size(0), a.size(1) + b.size(1)}, a.options());
    launch_cat_columns(y.data_ptr<float>(), a.data_ptr<float>(), a.size(1), b.data_ptr<float>(), b.size(1), a.size(0),
                       reinterpret_cast<void*>(stream));
    return y;
}
"""

_RNN_MODEL = '''BATCH_SIZE = 256  # the problem's batch_size: the reference draws its hidden state of that shape first


class ModelNew(nn.Module):
    """h = tanh(i2h(cat(x, h0))), out = h2o(h), both Linear layers on the GEMM."""

    def __init__(self, input_size: int, hidden_size: int, output_size: int):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.output_size = output_size
        # drawn before the Linear layers, as the reference draws it: the same seed gives the same values
        self.hidden = torch.randn((BATCH_SIZE, hidden_size))
        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
        self.h2o = nn.Linear(hidden_size, output_size)
        self.tanh = nn.Tanh()

    def forward(self, x: torch.Tensor, initial_hidden=None) -> torch.Tensor:
        if initial_hidden is not None:
            self.hidden.copy_(initial_hidden)
        self.hidden = self.hidden.to(x.device)
        stream = torch.cuda.current_stream(x.device).cuda_stream
        combined = _ext.cat_columns(x, self.hidden, stream)  # cat((x, hidden), dim 1), by the copy engine
        self.hidden = _ext.gemm3x(combined, self.i2h.weight, self.i2h.bias, 1.0, 0.0, 0.0, stream)
        return _ext.gemm3x(self.hidden, self.h2o.weight, self.h2o.bias, 0.0, 0.0, 0.0, stream)
'''

MODELS: tuple[ModelSolution, ...] = (
    ModelSolution(
        "level3/50_ReLUSelfAttention.py",
        "causal ReLU self-attention (minGPT's layer with ReLU for softmax): c_attn on the 3xTF32 wgmma GEMM\n"
        "with its bias in the epilogue; scores, scale, causal mask, ReLU and the product with v in one kernel\n"
        "(bench/tc_fp32/relu_attention.cu, 3xTF32 `mma.sync m16n8k8`) that never stores the T x T scores.",
        _RELU_ATTENTION_MODEL, ("relu_attention.cu",), _RELU_ATTENTION_CPP,
        (("relu_attention", "causal ReLU attention of qkv (B, T, 3C), 3xTF32 mma.sync"),)),
    ModelSolution(
        "level3/4_LeNet5.py",
        "LeNet-5 whole in one kernel of float32 FMAs (bench/tc_fp32/lenet5.cu): a block takes two images through\n"
        "both convolutions with their ReLU and pooling and the three Linear layers in shared memory, reading\n"
        "only the images and writing only the logits.",
        _LENET_MODEL, ("lenet5.cu",), _LENET_CPP, (("lenet5", "LeNet-5's forward in one kernel"),), gemm=False),
    ModelSolution(
        "level3/17_SqueezeNetFireModule.py",
        "SqueezeNet's Fire module whole in one kernel of float32 FMAs (bench/tc_fp32/fire_module.cu): squeeze and\n"
        "its ReLU over a tile and its halo in shared memory, then both expands with their ReLU, each output\n"
        "value written once in its place in the concatenation.",
        _FIRE_MODEL, ("fire_module.cu",), _FIRE_CPP, (("fire_module", "the Fire module's forward in one kernel"),),
        gemm=False),
    ModelSolution(
        "level3/5_AlexNet.py",
        "AlexNet (batch 1024, 224 x 224): each convolution (11 x 11 stride 4, 5 x 5, 3 x 3) unfolded into rows and\n"
        "multiplied on the 3xTF32 wgmma GEMM with its bias and ReLU in the epilogue, the activations\n"
        "channels-last throughout (bench/tc_fp32/convnet.cu: the unfold, the weights' layout, the 3 x 3 stride-2\n"
        "pooling, the flatten); the classifier's Linear layers on the same GEMM.",
        _ALEXNET_MODEL, ("convnet.cu",), _CONVNET_CPP, _CONVNET_BINDS, epilogue=_BIAS_RELU,
        epilogue_note=_BIAS_RELU_NOTE),
    ModelSolution(
        "level3/6_GoogleNetInceptionModule.py",
        "GoogLeNet's Inception module (batch 10, 480 channels, 224 x 224), channels-last: the three 1 x 1\n"
        "convolutions of x as one product on the 3xTF32 wgmma GEMM, the 3 x 3 and 5 x 5 convolutions unfolded\n"
        "from its channels and multiplied on it, the pooling branch's 3 x 3 max pooling and 1 x 1 product, and\n"
        "the four branches written once, channels-first, side by side (bench/tc_fp32/convnet.cu).",
        _INCEPTION_MODEL, ("convnet.cu",), _CONVNET_CPP, _CONVNET_BINDS, epilogue=_BIAS_RELU,
        epilogue_note=_BIAS_RELU_NOTE),
    *(ModelSolution(f"level3/{path}.py", _VGG_SUMMARY.format(name=name), _vgg_model(name, cfg), ("convnet.cu",),
                    _CONVNET_CPP, _CONVNET_BINDS, epilogue=_BIAS_RELU, epilogue_note=_BIAS_RELU_NOTE)
      for path, name, cfg in (("11_VGG16", "VGG16", _VGG16), ("12_VGG19", "VGG19", _VGG19))),
    ModelSolution(
        "level3/13_DenseNet121TransitionLayer.py",
        "DenseNet's transition layer whole in one kernel of float32 FMAs (bench/tc_fp32/transition.cu): BatchNorm\n"
        "with its running statistics, ReLU, and the 2 x 2 average pooling taken before the bias-free 1 x 1\n"
        "convolution (both linear: the same values for a quarter of the products); the input read once, the\n"
        "output written once.",
        _TRANSITION_MODEL, ("transition.cu",), _TRANSITION_CPP,
        (("densenet_transition", "DenseNet's transition layer in one kernel"),), gemm=False),
    ModelSolution(
        "level3/31_VisionAttention.py",
        "multi-head self-attention over an image's pixels, then LayerNorm(attention + x): the in and out\n"
        "projections on the 3xTF32 wgmma GEMM with their biases in the epilogue; the heads' softmax attention\n"
        "in one flash kernel (bench/tc_fp32/vision_attention.cu, 3xTF32 `mma.sync m16n8k8`, the L x L scores\n"
        "never stored; the averaged attention weights the model drops are not made); the image's layout to\n"
        "tokens and back and the residual LayerNorm in kernels of their own.",
        _VISION_ATTENTION_MODEL, ("vision_attention.cu",), _VISION_ATTENTION_CPP,
        (("to_tokens", "an image (B, C, H, W) as token rows (H W B, C)"),
         ("mha_attention", "softmax attention of every head of qkv (L N, 3E), flash, 3xTF32 mma.sync"),
         ("residual_layernorm", "LayerNorm(a + x) over channels, written as (B, C, H, W)"))),
    *(ModelSolution(f"level3/{name}.py", _MLP_SUMMARY, _mlp_model(sizes), epilogue=_BIAS_RELU,
                    epilogue_note=_BIAS_RELU_NOTE)
      for name, sizes in (("1_MLP", "layer_sizes"), ("2_ShallowWideMLP", "hidden_layer_sizes"),
                          ("3_DeepNarrowMLP", "hidden_layer_sizes"))),
    ModelSolution(
        "level3/33_VanillaRNN.py",
        "one step of a vanilla RNN cell, h = tanh(i2h(cat(x, h0))), out = h2o(h): both Linear layers on the\n"
        "3xTF32 wgmma GEMM, tanh in i2h's epilogue; the concatenation by the copy engine (bench/tc_fp32/rnn_cell.cu).",
        _RNN_MODEL, ("rnn_cell.cu",), _RNN_CPP, (("cat_columns", "cat((a, b), dim 1) by the copy engine"),),
        epilogue=_BIAS_TANH, epilogue_note=_BIAS_TANH_NOTE),
)

_FILE = ("{head}" + '"""Solution for {path}:\n{summary}\n\n{method}'
         + "Generated by bench/tc_fp32_sync.py from bench/tc_fp32 ({kernels}): edit those, not this file.\n"
         + '"""\n\n{imports}' + _SOURCES
         + "\n_ext = " + _LOAD + "\n\n\n{model}")


_BARE_CPP = ("#include <torch/types.h>\n#include <torch/csrc/utils/pybind.h>\n\n#include <cstdint>\n\n"
             + _PYBIND + "}\n")


def render_model_cpp(sol: ModelSolution) -> str:
    """The GEMM's wrapper (B N x K, a bias), where the model has the core, with the model's own wrappers and
    bindings beside it."""
    cpp = render_cpp(False, True, False) if sol.gemm else _BARE_CPP
    if cpp.count(_PYBIND) != 1:
        raise ValueError("the GEMM's C++ template must hold one PYBIND11_MODULE block")
    binds = "".join(f'    m.def("{name}", &{name}, "{what}");\n' for name, what in sol.binds)
    cpp = cpp.replace(_PYBIND, sol.cpp.lstrip("\n") + "\n" + _PYBIND + binds)
    return cpp


def render_model_cuda(sol: ModelSolution) -> str:
    """The core with the bias epilogue, then the model's kernels."""
    parts = [render_cuda(sol.epilogue)] if sol.gemm else []
    for name in sol.kernels:
        text = (KERNELS / name).read_text()
        if '"""' in text:
            raise ValueError(f"{name} must hold no triple quote")
        parts.append(f"// ---- {name} ----\n{text}")
    return "\n".join(parts)


def render_model(sol: ModelSolution) -> str:
    """The whole solution file."""
    imports = "import math\n\n" if "math." in sol.model else ""
    kernels = ", ".join(("gemm_core.cu", *sol.kernels) if sol.gemm else sol.kernels)
    method = "The GEMM core: " + _METHOD.format(
        orientation="B (N x K) is K-major as it lies: a Linear's weight, copied by TMA.",
        epilogue_note=sol.epilogue_note) + "\n" if sol.gemm else ""
    head = _HEAD if sol.gemm else _HEAD.replace("gemm_core.cu", ", ".join(sol.kernels))
    return _FILE.format(head=head, imports=imports, path=sol.path, summary=sol.summary, kernels=kernels, method=method,
                        ext=sol.ext_name, cpp=render_model_cpp(sol), variant_mark=VARIANT_MARK, b_kn_int=0,
                        core=render_model_cuda(sol), model=sol.model)


def expected_model_files(out: Path = OUT) -> dict[Path, str]:
    """Every model solution under `out` and its content."""
    return {out / sol.path: render_model(sol) for sol in MODELS}
