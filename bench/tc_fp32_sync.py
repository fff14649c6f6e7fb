"""Writes the strict-FP32 tensor-core KernelBench solutions from one GEMM core.

Each solution in bench/kernelbench_solutions/fp32_tc/ must be one self-contained file (the harness
verifies one source file per candidate), so the 3xTF32 wgmma core (bench/tc_fp32/gemm_core.cu)
appears in every one of them. This script is the only writer: it joins the core, the problem's
epilogue, the operand orientation and the problem's `ModelNew`, so the copies never drift apart.

    python bench/tc_fp32_sync.py           # (re)write the solutions
    python bench/tc_fp32_sync.py --check   # exit 1 when a written file differs from what it would write
    python bench/tc_fp32_sync.py --part DIR/parts/part02.py [--part-out FILE]   # a decomposed model's part

`--part` writes a candidate for a part of a decomposed model (`kb-mcp decompose`) that is one nn.Linear
with an optional pointwise op: the core with the bias and the op as its epilogue, the Linear at the
part's own name (`part_candidate`; bench/l3_linear_parts.py runs it over level-3 models). It exits 2,
saying why, for a part the core cannot serve.

It also writes the level-3 model solutions of bench/kernelbench_solutions/fp32_tc_models/ (the core
for their Linear layers, and kernels of their own from bench/tc_fp32; bench/tc_fp32_models.py renders
them); `--check` covers them too.

`unit_sources` gives the same core with an identity epilogue for bench/tc_fp32_check.py's unit test.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "bench" / "tc_fp32" / "gemm_core.cu"
OUT = ROOT / "bench" / "kernelbench_solutions" / "fp32_tc"
EPILOGUE_MARK = "// @epilogue"
VARIANT_MARK = "// @variant-defines"  # bench/tc_fp32_check.py puts a variant's #defines here
EXT_PREFIX = "kbmcp_fp32tc_"
# The core's default ring depths (its STAGES): with TMA where B is N x K, through registers where it is K x N.
TMA_STAGES, REG_STAGES = 4, 3


@dataclass(frozen=True)
class Solution:
    """One problem's solution: what differs from the others."""

    path: str  # relative to the fp32_tc folder, named as the KernelBench problem file
    summary: str  # the docstring's first line: what the problem computes
    b_kn: bool  # B is K x N row-major (torch.matmul(A, B)) rather than N x K
    bias: bool  # the wrapper takes a per-column bias
    add: bool  # ... and a second per-column vector
    epilogue: str  # C++ body of `epilogue(v, row, col, e)`: v is the float32 dot product
    model: str  # the ModelNew class

    @property
    def ext_name(self) -> str:
        stem = Path(self.path).stem.split("_")[0]
        return f"{EXT_PREFIX}{Path(self.path).parent.name}_{stem}"


def _linear_model(doc: str, args: str, layer: str, keep: str = "", scalars: str = "0.0, 0.0, 0.0",
                  vector: str = "", linear_args: str = "", optional_bias: bool = False) -> str:
    """A ModelNew around one nn.Linear, named as the problem names it so that the state dicts match.

    `keep`: constructor arguments kept as attributes (read in forward); `scalars`: the epilogue's
    p0, p1, p2; `vector`: a parameter created after the Linear, as the reference does (its `add`)."""
    names = [a.split("=")[0].strip() for a in args.split(",")]
    lines = [f"        self.{name} = {name}" for name in keep.split()]
    if vector:
        lines.append("        # drawn after the Linear's parameters, as the reference draws it")
        lines.append(f"        self.{vector}")
    extra = "".join(line + "\n" for line in lines)
    vec_arg = f", self.{vector.split()[0]}" if vector else ""
    bias = (f"""        bias = self.{layer}.bias
        if bias is None:  # built with bias=False: the Linear adds nothing
            bias = torch.zeros(self.{layer}.out_features, device=x.device, dtype=x.dtype)
""" if optional_bias else f"        bias = self.{layer}.bias\n")
    return f'''class ModelNew(nn.Module):
    """{doc}"""

    def __init__(self, {args}) -> None:
        super().__init__()
        # created first, as the reference creates it: the same seed gives the same values
        self.{layer} = nn.Linear({linear_args or ", ".join(names[:2])})
{extra}
    def forward(self, x: torch.Tensor) -> torch.Tensor:
{bias}        return _ext.gemm3x(x, self.{layer}.weight, bias{vec_arg},
                           {scalars},
                           torch.cuda.current_stream(x.device).cuda_stream)
'''


_MATMUL_MODEL = '''class ModelNew(nn.Module):
    """{doc}"""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return _ext.gemm3x(A, B, 0.0, 0.0, 0.0, torch.cuda.current_stream(A.device).cuda_stream)
'''


def _matmul(path: str, summary: str, b_kn: bool) -> Solution:
    return Solution(path, summary, b_kn, False, False, "return v;",
                    _MATMUL_MODEL.format(doc=summary))


SOLUTIONS: tuple[Solution, ...] = (
    _matmul("level1/1_Square_matrix_multiplication_.py", "C = A @ B (N x N, B read as K x N).", True),
    _matmul("level1/2_Standard_matrix_multiplication_.py", "C = A @ B (M x K by K x N).", True),
    _matmul("level1/17_Matmul_with_transposed_B.py", "C = A @ B.T (B is N x K: K-major as it lies).", False),
    Solution("level2/9_Matmul_Subtract_Multiply_ReLU.py", "relu((Linear(x) - subtract_value) * multiply_value).",
             False, True, False,
             "float x = v + __ldg(e.bias + col);\n    x = (x - e.p0) * e.p1;\n    return x > 0.0f ? x : 0.0f;",
             _linear_model("relu((Linear(x) - subtract_value) * multiply_value).",
                           "in_features, out_features, subtract_value, multiply_value", "linear",
                           "subtract_value multiply_value",
                           "float(self.subtract_value), float(self.multiply_value), 0.0")),
    Solution("level2/12_Gemm_Multiply_LeakyReLU.py", "LeakyReLU(Linear(x) * multiplier, negative_slope).",
             False, True, False,
             "float x = (v + __ldg(e.bias + col)) * e.p0;\n    return x > 0.0f ? x : x * e.p1;",
             _linear_model("LeakyReLU(Linear(x) * multiplier, negative_slope).",
                           "in_features, out_features, multiplier, negative_slope", "gemm",
                           "multiplier negative_slope", "float(self.multiplier), float(self.negative_slope), 0.0")),
    Solution("level2/29_Matmul_Mish_Mish.py", "mish(mish(Linear(x))).", False, True, False,
             "return mish_f(mish_f(v + __ldg(e.bias + col)));",
             _linear_model("mish(mish(Linear(x))).", "in_features, out_features", "linear")),
    Solution("level2/53_Gemm_Scaling_Hardtanh_GELU.py", "gelu(hardtanh(Linear(x) * scaling_factor, min, max)).",
             False, True, False,
             "return gelu_erf(clamp_f((v + __ldg(e.bias + col)) * e.p0, e.p1, e.p2));",
             _linear_model("gelu(hardtanh(Linear(x) * scaling_factor, hardtanh_min, hardtanh_max)), erf GELU.",
                           "in_features, out_features, scaling_factor, hardtanh_min, hardtanh_max", "gemm",
                           "scaling_factor hardtanh_min hardtanh_max",
                           "float(self.scaling_factor), float(self.hardtanh_min), float(self.hardtanh_max)")),
    Solution("level2/59_Matmul_Swish_Scaling.py", "swish(Linear(x)) * scaling_factor.", False, True, False,
             "float x = v + __ldg(e.bias + col);\n    x = x * sigmoid_f(x);\n    return x * e.p0;",
             _linear_model("swish(Linear(x)) * scaling_factor.", "in_features, out_features, scaling_factor",
                           "matmul", "scaling_factor", "float(self.scaling_factor), 0.0, 0.0")),
    Solution("level2/70_Gemm_Sigmoid_Scaling_ResidualAdd.py", "sigmoid(Linear(x)) * scaling_factor + Linear(x).",
             False, True, False,
             "const float x = v + __ldg(e.bias + col);\n    return sigmoid_f(x) * e.p0 + x;",
             _linear_model("sigmoid(Linear(x)) * scaling_factor + Linear(x).",
                           "input_size, hidden_size, scaling_factor", "gemm", "scaling_factor",
                           "float(self.scaling_factor), 0.0, 0.0")),
    Solution("level2/81_Gemm_Swish_Divide_Clamp_Tanh_Clamp.py",
             "clamp(tanh(clamp(swish(Linear(x)) / 2, -1, 1)), -1, 1).", False, True, False,
             "float x = v + __ldg(e.bias + col);\n    x = x * sigmoid_f(x);\n    x = x / 2.0f;\n"
             "    x = clamp_f(x, -1.0f, 1.0f);\n    return clamp_f(tanhf(x), -1.0f, 1.0f);",
             _linear_model("clamp(tanh(clamp(swish(Linear(x)) / 2, -1, 1)), -1, 1).",
                           "in_features, out_features, bias=True", "gemm",
                           linear_args="in_features, out_features, bias=bias", optional_bias=True)),
    Solution("level2/86_Matmul_Divide_GELU.py", "gelu(Linear(x) / divisor), erf GELU.", False, True, False,
             "return gelu_erf((v + __ldg(e.bias + col)) / e.p0);",
             _linear_model("gelu(Linear(x) / divisor), erf GELU.", "input_size, output_size, divisor", "linear",
                           "divisor", "float(self.divisor), 0.0, 0.0")),
    Solution("level2/95_Matmul_Add_Swish_Tanh_GELU_Hardtanh.py",
             "hardtanh(gelu(tanh(swish(Linear(x) + add_value))), -1, 1).", False, True, True,
             "float x = (v + __ldg(e.bias + col)) + __ldg(e.add + col);\n    x = sigmoid_f(x) * x;\n"
             "    x = tanhf(x);\n    x = gelu_erf(x);\n    return clamp_f(x, -1.0f, 1.0f);",
             _linear_model("hardtanh(gelu(tanh(swish(Linear(x) + add_value))), -1, 1), erf GELU.",
                           "in_features, out_features, add_value_shape", "matmul",
                           vector="add_value = nn.Parameter(torch.randn(add_value_shape))")),
)

# The C++ side: checks, the output allocation and the call into the CUDA launcher (no torch header in
# the CUDA source: it compiles with nvcc alone, which keeps builds short).
_CPP = r"""#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>

// Defined in the CUDA source (the 3xTF32 wgmma GEMM with this problem's epilogue).
void launch_gemm3x(const float* a, const float* b, float* c, int M, int N, int K, const float* bias,
                   const float* add, float p0, float p1, float p2, void* stream);

namespace {
constexpr bool kBKN = {b_kn};  // B is K x N (else N x K)

void check_input(const torch::Tensor& t, const torch::Tensor& like, const char* what) {
    TORCH_CHECK(t.is_cuda() && t.device() == like.device(), what, " must be on the input's CUDA device");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32");
    TORCH_CHECK(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0, what, " must be 16-byte aligned");
}

const float* column_vector(const torch::Tensor& v, const torch::Tensor& like, int64_t n, const char* what) {
    TORCH_CHECK(v.numel() == n && v.is_contiguous(), what, " must be a contiguous vector of ", n, " values");
    check_input(v, like, what);
    return v.data_ptr<float>();
}
}  // namespace

torch::Tensor gemm3x(torch::Tensor a, torch::Tensor b{vector_params},
                     double p0, double p1, double p2, int64_t stream) {
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "gemm3x: 2-D operands expected");
    a = a.contiguous();
    b = b.contiguous();
    check_input(a, a, "A");
    check_input(b, a, "B");
    const int64_t M = a.size(0), K = a.size(1);
    const int64_t N = kBKN ? b.size(1) : b.size(0);
    TORCH_CHECK((kBKN ? b.size(0) : b.size(1)) == K, "gemm3x: inner dimensions differ");
    TORCH_CHECK(K % 4 == 0 && (!kBKN || N % 4 == 0), "gemm3x: float4 rows need K (and N of a K x N B) % 4 == 0");
    TORCH_CHECK(M < (1LL << 31) && N < (1LL << 31) && K < (1LL << 31), "gemm3x: sizes must fit int32");
{vector_checks}    auto c = torch::empty({M, N}, a.options());
    launch_gemm3x(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), static_cast<int>(M),
                  static_cast<int>(N), static_cast<int>(K), {bias_ptr}, {add_ptr}, static_cast<float>(p0),
                  static_cast<float>(p1), static_cast<float>(p2), reinterpret_cast<void*>(stream));
    return c;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("gemm3x", &gemm3x, "epilogue(A . op(B)) with 3xTF32 wgmma at float32 accuracy");
}
"""

_HEAD = "# long: one self-contained candidate (the harness verifies one file), from bench/tc_fp32/gemm_core.cu\n"

# What every generated file says of the kernel, after its first lines.
_METHOD = """Track fp32, on the tensor cores at float32 accuracy ("3xTF32"): each value x is split into a high
part, x itself (the tensor core reads a float32 operand's top 19 bits, TF32), and a remainder
lo = tf32(x - x with its low 13 bits cleared); every product is lo*hi' + hi*lo' + hi*hi' on Hopper
`wgmma m64n128k8 .tf32` (sm_90a) with float32 accumulation, each K stage in a fresh fragment added
to float32 registers. 128 x 128 x 32 tiles, 384 threads: a producer warpgroup and two consumer
warpgroups, paced by mbarriers; each consumer loads its 64-row slice of A with ldmatrix and splits
it in registers, and the tensor core reads B's high and low tiles from shared memory.
{orientation}
{epilogue_note}
"""

# The imports and the extension's sources: module-level constants, so that the harness reads them
# from the syntax tree (its builds ahead and compile-only checks) wherever load_inline is called.
_SOURCES = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_EXT_NAME = "{ext}"

CPP = r"""
{cpp}"""

CUDA = r"""
{variant_mark}
#define B_KN {b_kn_int}
{core}"""
'''

_LOAD = """load_inline(
    name=_EXT_NAME,
    cpp_sources=CPP,
    cuda_sources=CUDA,
    no_implicit_headers=True,
    extra_cuda_cflags=["-O3"],
)"""

_FILE = (_HEAD + '"""Solution for {path}:\n{summary}\n\n' + _METHOD
         + "\nGenerated by bench/tc_fp32_sync.py from bench/tc_fp32/gemm_core.cu: edit those, not this file.\n"
         + '"""\n\n' + _SOURCES + "\n_ext = " + _LOAD + "\n\n\n{model}")


def render_cpp(b_kn: bool, bias: bool, add: bool) -> str:
    """The C++ wrapper for an operand orientation and the epilogue's vectors."""
    params = "".join(f", torch::Tensor {n}" for n, on in (("bias", bias), ("add", add)) if on)
    checks = "".join(f'    const float* {n}_ptr = column_vector({n}, a, N, "{n}");\n'
                     for n, on in (("bias", bias), ("add", add)) if on)
    return (_CPP.replace("{b_kn}", "true" if b_kn else "false").replace("{vector_params}", params)
            .replace("{vector_checks}", checks).replace("{bias_ptr}", "bias_ptr" if bias else "nullptr")
            .replace("{add_ptr}", "add_ptr" if add else "nullptr"))


def render_cuda(epilogue_body: str) -> str:
    """The core with `epilogue_body` as the body of its epilogue function."""
    core = CORE.read_text()
    if core.count(EPILOGUE_MARK) != 1 or '"""' in core:
        raise ValueError(f"{CORE} must hold the marker {EPILOGUE_MARK!r} once and no triple quote")
    function = ("__device__ __forceinline__ float epilogue(float v, int row, int col, const EpiArgs& e) {\n"
                f"    (void)row;\n    (void)e;\n    {epilogue_body}\n}}")
    return core.replace(EPILOGUE_MARK, function)


def _orientation(b_kn: bool) -> str:
    """How the producer stages B, as the docstring says it."""
    if b_kn:
        return ("B (K x N) must become K-major tiles, which a TMA copy cannot give: the producer warpgroup loads\n"
                "both operands through registers, transposes B there and stores A, B and B's low tile into a\n"
                f"{REG_STAGES}-stage shared ring, one tile at a time.")
    return ("B (N x K) is K-major as it lies: one producer thread copies each stage's A and B tiles by TMA\n"
            f"(128-byte swizzled) into a {TMA_STAGES}-stage shared ring, and the producer's other three warps\n"
            "compute B's low tile from the copied one, which is its high tile as it lies.")


def _epilogue_note(bias: bool) -> str:
    return ("The bias and the problem's elementwise chain are applied to the accumulators before the\n"
            "only store." if bias else "The product is stored as it is.")


def render_solution(sol: Solution) -> str:
    """The whole solution file."""
    return _FILE.format(path=sol.path, summary=sol.summary, orientation=_orientation(sol.b_kn),
                        epilogue_note=_epilogue_note(sol.bias), ext=sol.ext_name,
                        cpp=render_cpp(sol.b_kn, sol.bias, sol.add), variant_mark=VARIANT_MARK,
                        b_kn_int=int(sol.b_kn), core=render_cuda(sol.epilogue), model=sol.model)


def unit_sources(b_kn: bool) -> tuple[str, str]:
    """C++ and CUDA sources of a bare GEMM (identity epilogue) in one orientation, for unit tests;
    the CUDA source starts with the variant marker, as the solutions' do."""
    return render_cpp(b_kn, False, False), f"{VARIANT_MARK}\n#define B_KN {int(b_kn)}\n" + render_cuda("return v;")


def expected_files(out: Path = OUT) -> dict[Path, str]:
    """Every generated file under `out` and its content."""
    return {out / sol.path: render_solution(sol) for sol in SOLUTIONS}


def stale_files(files: dict[Path, str]) -> list[Path]:
    """Of the files this script writes (path -> text), those missing or differing on disk."""
    return [p for p, text in files.items() if not p.is_file() or p.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a solution differs from the core")
    parser.add_argument("--out", type=Path, default=OUT, help="solutions folder (default: the shipped one)")
    parser.add_argument("--part", type=Path, metavar="PART_FILE",
                        help="write the candidate for a Linear part of a decomposed model (kb-mcp decompose's "
                        "DIR/parts/partNN.py) to --part-out, or print it")
    parser.add_argument("--part-out", type=Path, metavar="FILE", help="where --part writes its candidate")
    parser.add_argument("--models-out", type=Path,
                        help="the level-3 model solutions' folder (default: the shipped fp32_tc_models)")
    args = parser.parse_args(argv)
    if args.part:
        from tc_fp32_parts import PartRefused, part_candidate  # it builds on this module's templates

        try:
            text = part_candidate(args.part)
        except PartRefused as exc:
            print(f"no candidate for {args.part}: {exc}", file=sys.stderr)
            return 2
        if args.part_out:
            args.part_out.parent.mkdir(parents=True, exist_ok=True)
            args.part_out.write_text(text)
        else:
            sys.stdout.write(text)
        return 0
    from tc_fp32_models import OUT as MODELS_OUT  # it builds on this module's templates
    from tc_fp32_models import expected_model_files

    files = expected_files(args.out) | expected_model_files(args.models_out or MODELS_OUT)
    if args.check:
        stale = stale_files(files)
        for p in stale:
            print(f"out of date: {p} (run python bench/tc_fp32_sync.py)")
        return 1 if stale else 0
    for p in stale_files(files):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(files[p])
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
