"""Whole-model solutions of level 3 on the strict-FP32 tensor-core kernels: every op of the model in a
kernel of our own, written from the GEMM core (bench/tc_fp32/gemm_core.cu) and the model's own kernels
beside it in bench/tc_fp32: each `NAME.cu` with its C++ wrappers (the torch-facing functions, which
check the shapes and call the launchers) in `NAME.cpp`, and what they all share (the launch and
argument checks) in `model_common.cu` and `.cpp`, put first.

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
COMMON = "model_common.cu"  # put before every model's own kernels, and its .cpp before their wrappers
_PYBIND = "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"


@dataclass(frozen=True)
class ModelSolution:
    """A level-3 model's solution: the core with a bias epilogue for its Linear layers, and kernels of
    the model's own (a .cu file of bench/tc_fp32 each) with their C++ wrappers."""

    path: str  # relative to OUT, named as the KernelBench problem file
    summary: str  # the docstring's first lines: what the model computes and which kernel does what
    model: str  # the ModelNew class
    kernels: tuple[str, ...] = ()  # .cu files of bench/tc_fp32, appended to the core in this order; each one's
    # C++ wrappers (the launchers' declarations, the torch-facing functions) in the .cpp of the same name,
    # where it has any (device helpers such as mma_3xtf32.cu have none)
    binds: tuple[tuple[str, str], ...] = ()  # (function, its description) bound beside gemm3x
    epilogue: str = "return v + __ldg(e.bias + col);"  # the GEMM's, on the biased dot product's terms
    epilogue_note: str = "The bias is added to the accumulators before the only store."
    gemm: bool = True  # the GEMM core is in it (else only the model's own kernels)

    @property
    def ext_name(self) -> str:
        return f"{EXT_PREFIX}{Path(self.path).parent.name}_{Path(self.path).stem.split('_')[0]}"


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

_RNN_SEQUENCE_MODEL = '''class ModelNew(nn.Module):
    """A vanilla RNN over a sequence: the input products of every step as one GEMM, the recurrence in one
    launch (W_h in shared memory for the whole sequence), the output products as one GEMM."""

    def __init__(self, input_size: int, hidden_size: int, output_size: int):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.output_size = output_size
        # the reference's layers, names and order: its state dict loads by name, the same seed gives the same values
        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
        self.h2o = nn.Linear(hidden_size, output_size)
        self.tanh = nn.Tanh()

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        stream = torch.cuda.current_stream(x.device).cuda_stream
        return _ext.rnn_sequence(x.contiguous(), h0.to(x.device).contiguous(), self.i2h.weight, self.i2h.bias,
                                 self.h2o.weight, self.h2o.bias, stream)
'''

_NETVLAD_MODEL = '''class ModelNew(nn.Module):
    """NetVLAD in one kernel, a block per batch element: the assignment, its BatchNorm (running
    statistics) and softmax in shared memory, the residual sums and both normalisations in registers."""

    def __init__(self, cluster_size, feature_size, ghost_clusters):
        super().__init__()
        # the reference's parameters, names and order: its state dict loads by name, the same seed gives the
        # same values
        self.feature_size = feature_size
        self.cluster_size = cluster_size
        self.ghost_clusters = ghost_clusters
        init_sc = (1 / math.sqrt(feature_size))
        clusters = cluster_size + ghost_clusters
        self.clusters = nn.Parameter(init_sc * torch.randn(feature_size, clusters))
        self.batch_norm = nn.BatchNorm1d(clusters)
        self.clusters2 = nn.Parameter(init_sc * torch.randn(1, feature_size, cluster_size))
        self.out_dim = self.cluster_size * feature_size

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        if self.training:  # BatchNorm from the batch's own statistics is not what the kernel computes
            raise RuntimeError("this kernel computes inference BatchNorm (running statistics): call .eval() first")
        bn = self.batch_norm
        assert bn.running_mean is not None and bn.running_var is not None
        stream = torch.cuda.current_stream(x.device).cuda_stream
        return _ext.netvlad(x, self.clusters, bn.running_mean, bn.running_var, bn.weight, bn.bias, bn.eps,
                            self.clusters2, stream)
'''

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
        # The reference copies initial_hidden into its hidden state, then concatenates: the same values as
        # concatenating initial_hidden itself, without a device copy outside the concatenation
        h0 = initial_hidden if initial_hidden is not None else self.hidden.to(x.device)
        stream = torch.cuda.current_stream(x.device).cuda_stream
        combined = _ext.cat_columns(x, h0, stream)  # cat((x, h0), dim 1), by the copy engine
        self.hidden = _ext.gemm3x(combined, self.i2h.weight, self.i2h.bias, 1.0, 0.0, 0.0, stream)
        return _ext.gemm3x(self.hidden, self.h2o.weight, self.h2o.bias, 0.0, 0.0, 0.0, stream)
'''

MODELS: tuple[ModelSolution, ...] = (
    ModelSolution(
        "level3/50_ReLUSelfAttention.py",
        "causal ReLU self-attention (minGPT's layer with ReLU for softmax): c_attn on the 3xTF32 wgmma GEMM\n"
        "with its bias in the epilogue; scores, scale, causal mask, ReLU and the product with v in one kernel\n"
        "(bench/tc_fp32/relu_attention.cu, 3xTF32 `mma.sync m16n8k8`) that never stores the T x T scores.",
        _RELU_ATTENTION_MODEL, ("mma_3xtf32.cu", "relu_attention.cu"),
        (("relu_attention", "causal ReLU attention of qkv (B, T, 3C), 3xTF32 mma.sync"),)),
    ModelSolution(
        "level3/4_LeNet5.py",
        "LeNet-5 whole in one kernel of float32 FMAs (bench/tc_fp32/lenet5.cu): a block takes two images through\n"
        "both convolutions with their ReLU and pooling and the three Linear layers in shared memory, reading\n"
        "only the images and writing only the logits.",
        _LENET_MODEL, ("lenet5.cu",), (("lenet5", "LeNet-5's forward in one kernel"),), gemm=False),
    ModelSolution(
        "level3/17_SqueezeNetFireModule.py",
        "SqueezeNet's Fire module whole in one kernel of float32 FMAs (bench/tc_fp32/fire_module.cu): squeeze and\n"
        "its ReLU over a tile and its halo in shared memory, then both expands with their ReLU, each output\n"
        "value written once in its place in the concatenation.",
        _FIRE_MODEL, ("fire_module.cu",), (("fire_module", "the Fire module's forward in one kernel"),),
        gemm=False),
    ModelSolution(
        "level3/5_AlexNet.py",
        "AlexNet (batch 1024, 224 x 224): each convolution (11 x 11 stride 4, 5 x 5, 3 x 3) unfolded into rows and\n"
        "multiplied on the 3xTF32 wgmma GEMM with its bias and ReLU in the epilogue, the activations\n"
        "channels-last throughout (bench/tc_fp32/convnet.cu: the unfold, the weights' layout, the 3 x 3 stride-2\n"
        "pooling, the flatten); the classifier's Linear layers on the same GEMM.",
        _ALEXNET_MODEL, ("convnet.cu",), _CONVNET_BINDS, epilogue=_BIAS_RELU,
        epilogue_note=_BIAS_RELU_NOTE),
    ModelSolution(
        "level3/6_GoogleNetInceptionModule.py",
        "GoogLeNet's Inception module (batch 10, 480 channels, 224 x 224), channels-last: the three 1 x 1\n"
        "convolutions of x as one product on the 3xTF32 wgmma GEMM, the 3 x 3 and 5 x 5 convolutions unfolded\n"
        "from its channels and multiplied on it, the pooling branch's 3 x 3 max pooling and 1 x 1 product, and\n"
        "the four branches written once, channels-first, side by side (bench/tc_fp32/convnet.cu).",
        _INCEPTION_MODEL, ("convnet.cu",), _CONVNET_BINDS, epilogue=_BIAS_RELU,
        epilogue_note=_BIAS_RELU_NOTE),
    *(ModelSolution(f"level3/{path}.py", _VGG_SUMMARY.format(name=name), _vgg_model(name, cfg), ("convnet.cu",),
                    _CONVNET_BINDS, epilogue=_BIAS_RELU, epilogue_note=_BIAS_RELU_NOTE)
      for path, name, cfg in (("11_VGG16", "VGG16", _VGG16), ("12_VGG19", "VGG19", _VGG19))),
    ModelSolution(
        "level3/13_DenseNet121TransitionLayer.py",
        "DenseNet's transition layer whole in one kernel of float32 FMAs (bench/tc_fp32/transition.cu): BatchNorm\n"
        "with its running statistics, ReLU, and the 2 x 2 average pooling taken before the bias-free 1 x 1\n"
        "convolution (both linear: the same values for a quarter of the products); the input read once, the\n"
        "output written once.",
        _TRANSITION_MODEL, ("transition.cu",),
        (("densenet_transition", "DenseNet's transition layer in one kernel"),), gemm=False),
    ModelSolution(
        "level3/31_VisionAttention.py",
        "multi-head self-attention over an image's pixels, then LayerNorm(attention + x): the in and out\n"
        "projections on the 3xTF32 wgmma GEMM with their biases in the epilogue; the heads' softmax attention\n"
        "in one flash kernel (bench/tc_fp32/vision_attention.cu, 3xTF32 `mma.sync m16n8k8`, the L x L scores\n"
        "never stored; the averaged attention weights the model drops are not made); the image's layout to\n"
        "tokens and back and the residual LayerNorm in kernels of their own.",
        _VISION_ATTENTION_MODEL, ("mma_3xtf32.cu", "vision_attention.cu"),
        (("to_tokens", "an image (B, C, H, W) as token rows (H W B, C)"),
         ("mha_attention", "softmax attention of every head of qkv (L N, 3E), flash, 3xTF32 mma.sync"),
         ("residual_layernorm", "LayerNorm(a + x) over channels, written as (B, C, H, W)"))),
    *(ModelSolution(f"level3/{name}.py", _MLP_SUMMARY, _mlp_model(sizes), epilogue=_BIAS_RELU,
                    epilogue_note=_BIAS_RELU_NOTE)
      for name, sizes in (("1_MLP", "layer_sizes"), ("2_ShallowWideMLP", "hidden_layer_sizes"),
                          ("3_DeepNarrowMLP", "hidden_layer_sizes"))),
    ModelSolution(
        "level3/34_VanillaRNNHidden.py",
        "a vanilla RNN over a 256-step sequence (batch 8, hidden 256): i2h's input products for every step as one\n"
        "3xTF32 wgmma GEMM with its bias, the recurrence tanh(P_t + W_h h_{t-1}) in one launch of float32 FMAs\n"
        "(bench/tc_fp32/rnn_sequence.cu: a cluster of 4 blocks per batch row, W_h in shared memory for the whole\n"
        "sequence, each step's h shared through distributed shared memory), h2o for every step as one GEMM.",
        _RNN_SEQUENCE_MODEL, ("rnn_sequence.cu",), (("rnn_sequence", "a vanilla RNN over a whole sequence"),),
        epilogue=_BIAS_RELU, epilogue_note=_BIAS_RELU_NOTE),
    *(ModelSolution(
        f"level3/{name}.py",
        "NetVLAD (batch 2048, 100 features of 512, 32 clusters" + ghosts + ") whole in one kernel of float32 FMAs\n"
        "(bench/tc_fp32/netvlad.cu), a block per batch element: the assignment with its BatchNorm (running\n"
        "statistics) and softmax in shared memory, the residual sums and both normalisations in registers;\n"
        "x read twice, nothing else out but the result.",
        _NETVLAD_MODEL, ("netvlad.cu",), (("netvlad", "NetVLAD in one kernel"),), gemm=False)
      for name, ghosts in (("46_NetVladWithGhostClusters", ", 16 ghost"), ("47_NetVladNoGhostClusters", ""))),
    ModelSolution(
        "level3/33_VanillaRNN.py",
        "one step of a vanilla RNN cell, h = tanh(i2h(cat(x, h0))), out = h2o(h): both Linear layers on the\n"
        "3xTF32 wgmma GEMM, tanh in i2h's epilogue; the concatenation by the copy engine (bench/tc_fp32/rnn_cell.cu).",
        _RNN_MODEL, ("rnn_cell.cu",), (("cat_columns", "cat((a, b), dim 1) by the copy engine"),),
        epilogue=_BIAS_TANH, epilogue_note=_BIAS_TANH_NOTE),
)

_FILE = ("{head}" + '"""Solution for {path}:\n{summary}\n\n{method}'
         + "Generated by bench/tc_fp32_sync.py from bench/tc_fp32's\n{kernels}: edit those, not this file.\n"
         + '"""\n\n{imports}' + _SOURCES
         + "\n_ext = " + _LOAD + "\n\n\n{model}")


_BARE_CPP = ("#include <torch/types.h>\n#include <torch/csrc/utils/pybind.h>\n\n#include <cstdint>\n\n"
             + _PYBIND + "}\n")


def _with_common(sol: ModelSolution) -> tuple[str, ...]:
    """The model's kernel files, after what all of them share (model_common: launch and argument checks)."""
    return (COMMON, *sol.kernels) if sol.kernels else ()


def render_model_cpp(sol: ModelSolution) -> str:
    """The GEMM's wrapper (B N x K, a bias), where the model has the core, with the model's own wrappers and
    bindings beside it."""
    cpp = render_cpp(False, True, False) if sol.gemm else _BARE_CPP
    if cpp.count(_PYBIND) != 1:
        raise ValueError("the GEMM's C++ template must hold one PYBIND11_MODULE block")
    binds = "".join(f'    m.def("{name}", &{name}, "{what}");\n' for name, what in sol.binds)
    wrappers = "".join(f.read_text() + "\n" for name in _with_common(sol)
                       if (f := (KERNELS / name).with_suffix(".cpp")).is_file())  # helpers have none
    if '"""' in wrappers:
        raise ValueError(f"the C++ wrappers of {sol.path} must hold no triple quote")
    return cpp.replace(_PYBIND, wrappers + _PYBIND + binds)


def render_model_cuda(sol: ModelSolution) -> str:
    """The core with the bias epilogue, then the model's kernels."""
    parts = [render_cuda(sol.epilogue)] if sol.gemm else []
    for name in _with_common(sol):
        text = (KERNELS / name).read_text()
        if '"""' in text:
            raise ValueError(f"{name} must hold no triple quote")
        parts.append(f"// ---- {name} ----\n{text}")
    return "\n".join(parts)


def render_model(sol: ModelSolution) -> str:
    """The whole solution file."""
    imports = "import math\n\n" if "math." in sol.model else ""
    kernels = ", ".join((("gemm_core.cu",) if sol.gemm else ()) + _with_common(sol))
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
