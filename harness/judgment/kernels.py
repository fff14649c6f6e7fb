"""What a candidate's forward ran, as plain data (server side, no torch): the PyTorch ops it may run
(`ALLOWED_OPS`), and the kernel census (`KernelCensus`: the GPU kernels one forward launched, sorted into
the candidate's own, vendor-library and PyTorch ones) with the findings drawn from it, and the
device time of one forward (`DeviceTime`: what its kernels took on the GPU, whatever the host did).

The census is taken in the census worker (`harness.worker.census`, `harness.worker.profiling`); the
pool carries it to the verify worker in `protocol.CensusReply`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.harness.judgment.static.vocabulary import ALLOW_GROUPS, expand_allow
from kb_mcp.harness.judgment.verdict import Finding, FindingCode

# Ops a candidate's forward may execute through PyTorch (by ATen overload-packet name)

ALLOWED_OPS: frozenset[str] = frozenset(
    """
    empty empty_like empty_strided new_empty new_empty_strided empty_permuted
    zeros zeros_like zero_ new_zeros ones ones_like new_ones full full_like new_full fill_ fill
    view _unsafe_view reshape as_strided expand expand_as permute transpose t unsqueeze squeeze
    flatten unflatten select slice narrow split split_with_sizes unbind chunk alias detach view_as
    contiguous clone movedim swapaxes swapdims diagonal _reshape_alias unfold
    sym_size sym_stride sym_numel sym_storage_offset size stride is_contiguous dim numel
    is_same_size _has_compatible_shallow_copy_type lift_fresh resolve_conj resolve_neg
    record_stream set_ _local_scalar_dense item
    """.split()
)
# Conversions are fine only when they are no-ops (the result is the input itself).
NOOP_ONLY_OPS: frozenset[str] = frozenset({"to", "type_as", "_to_copy", "float", "double", "half", "cuda"})
TORCH_NAMESPACES: frozenset[str] = frozenset({"aten", "prims", "quantized", "_quantized", "rngprims", "profiler"})


# Kernel census: which kernels ran, and who launched them

# Kernel names of vendor libraries (cuBLAS, cuBLASLt, cuDNN, cuFFT) and of PyTorch's own kernels.
_VENDOR_KERNEL = re.compile(
    r"^(void\s+)?(sm\d+_xmma_|xmma_|nvjet_|ampere_|volta_|turing_|maxwell_|hopper_|sm\d+_sgemm|gemmSN_|"
    r"gemmk1_|gemv2[NT]_|gemvNSP|gemvx|dot_kernel|scal_kernel|splitKreduce_|implicit_convolve_|cudnn|"
    r"cublas|fft2d_|fft3d_|regular_fft|vector_fft|winograd|precomputed_convolve|explicit_convolve|"
    r"conv2d_grouped_direct|cutlass_\d+_)"
    r"|\b(cudnn|cublas|cublasLt|cufft)\w*::|cutlass_\d+_(simt|tensorop|wmma)|\bcublas",
)
# Kernels torch.compile's Inductor generates (pointwise, reduction, persistent, template): PyTorch's
# code generator, not the candidate's; named like a library's so that composed mode never counts them own.
_GENERATED_KERNEL = re.compile(r"^triton_(poi|red|per|tem)_")
_TORCH_KERNEL = re.compile(r"\bat::native::|\bat::cuda::|at_cuda_detail|\bc10::|\bat::\(anonymous")


class KernelLaunch(BaseModel):
    """One GPU kernel (or memset/memcpy) seen during a censused call."""

    model_config = ConfigDict(extra="forbid")

    name: str
    op: str | None = None  # innermost PyTorch op that launched it (e.g. "aten::mm"); None = none
    kind: str = "kernel"  # kernel | memcpy | memset
    ns: int = 0  # its duration on the device (0: not known)


class KernelCensus(BaseModel):
    """The kernels one call launched, sorted into the candidate's own and library ones."""

    model_config = ConfigDict(extra="forbid")

    available: bool  # False when the profiler could not see GPU activity (no GPU, no CUPTI)
    launches: list[KernelLaunch] = Field(default_factory=list)
    own: list[str] = Field(default_factory=list)  # kernels of the candidate's own
    library: list[str] = Field(default_factory=list)  # vendor-library kernels launched outside any PyTorch op
    torch_ops: list[str] = Field(default_factory=list)  # PyTorch ops that launched kernels
    unattributed: list[str] = Field(default_factory=list)  # PyTorch kernels whose launching op the profiler lost
    graph_launches: int = 0  # CUDA graphs launched (cudaGraphLaunch) during the call
    note: str = ""


class DeviceTime(BaseModel):
    """The device time of one forward: per run, the summed durations of the GPU kernels, copies and
    sets it launched, as the profiler's activity records (CUPTI) give them; the median over the runs.

    It does not depend on the host process (launch costs, the Python around the call), which the
    end-to-end event time of a launch-bound call does. Kernels that overlap on several streams each
    count in full: it is the device's busy time, not the span of the call. Measured in the census
    worker (`harness.worker.profiling.measure_device_time`), never where candidates are timed.
    """

    model_config = ConfigDict(extra="forbid")

    ms: float | None = None  # None: not measured (`note` says why)
    kernels: int = 0  # kernels, copies and sets in one run (the most any run had)
    runs: int = 0  # profiled runs the median is over
    note: str = ""


def classify_launches(
    launches: Iterable[KernelLaunch], allow: Collection[str] = (), available: bool = True, graph_launches: int = 0
) -> KernelCensus:
    """Sorts launches: own kernels, vendor-library kernels, and kernels of PyTorch ops.

    A kernel launched by a PyTorch op (e.g. `aten::mm`) is PyTorch's, whatever its name. A kernel
    launched outside any PyTorch op is the candidate's own unless its name is a vendor library's
    (cuBLAS, cuDNN, ...), which means the candidate called the library directly. Allowed ops and
    library groups (`gemm` -> cuBLAS, `conv` -> cuDNN) are not counted against it.
    """
    allow_set = frozenset(allow)
    launches = list(launches)
    own: list[str] = []
    library: list[str] = []
    torch_ops: list[str] = []
    unattributed: list[str] = []
    for launch in launches:
        if launch.kind != "kernel":
            continue
        op = launch.op or ""
        if op.startswith(("aten::", "prims::", "quantized::")):
            packet = op.split("::", 1)[1].split(".")[0]
            if packet not in ALLOWED_OPS and packet not in allow_set and op not in torch_ops:
                torch_ops.append(op)
            continue
        if _GENERATED_KERNEL.search(launch.name):
            if launch.name not in library:
                library.append(launch.name)
            continue
        if _VENDOR_KERNEL.search(launch.name):
            lib = "cudnn" if re.search(r"cudnn|convolve|winograd|fft|conv2d", launch.name, re.I) else "cublas"
            if lib not in allow_set and launch.name not in library:
                library.append(launch.name)
            continue
        if _TORCH_KERNEL.search(launch.name) and not launch.op:
            # A PyTorch kernel whose launching op the profiler lost: not the candidate's own, and
            # not evidence of a banned op either (the op recorder judges ops issued from Python).
            if launch.name not in unattributed:
                unattributed.append(launch.name)
            continue
        if launch.name not in own:
            own.append(launch.name)
    return KernelCensus(
        available=available, launches=launches, own=own, library=library, torch_ops=torch_ops,
        unattributed=unattributed, graph_launches=graph_launches,
    )


def reclassify(census: KernelCensus, allow: Collection[str]) -> KernelCensus:
    """The same launches sorted again with another allowance (composed mode adds the reference's ops)."""
    if not census.available:
        return census
    again = classify_launches(census.launches, allow, census.available, census.graph_launches)
    return again.model_copy(update={"note": census.note})


def op_packet(op: str) -> str:
    """`aten::addmm.out` -> `addmm`: the overload-packet name both op records compare by."""
    return op.split("::", 1)[-1].split(".")[0]


def kernel_ops(census: KernelCensus) -> list[str]:
    """The PyTorch ops (`ns::name`) that launched kernels in a census: the reference's own op set
    at the level the census records (composed mode, `harness.judgment.composed`)."""
    return sorted({launch.op for launch in census.launches
                   if launch.kind == "kernel" and launch.op and launch.op.startswith(("aten::", "prims::"))})


def coverage(census: KernelCensus) -> float | None:
    """The share of one forward's GPU time in the candidate's own kernels (0..1): the durations of
    its own kernels over those of everything the forward ran on the device (kernels of PyTorch ops
    and libraries, copies and sets). None where the census saw no device durations."""
    if not census.available:
        return None
    own = set(census.own)
    total = sum(launch.ns for launch in census.launches)
    if total <= 0:
        return None
    mine = sum(launch.ns for launch in census.launches
               if launch.kind == "kernel" and launch.op is None and launch.name in own)
    return round(mine / total, 4)


def census_findings(census: KernelCensus, include_torch_ops: bool = True) -> list[Finding]:
    """`no_custom_kernel` and `library_call` findings from a census (none when it was unavailable).

    `include_torch_ops=False` leaves out kernels of PyTorch ops, for when the op recorder has
    already reported them with their source lines.
    """
    if not census.available:
        return []
    findings: list[Finding] = []
    if census.library:
        findings.append(
            Finding(
                code=FindingCode.library_call,
                message=(
                    f"forward launched vendor-library kernels ({', '.join(n[:60] for n in census.library[:3])}); "
                    "compute with your own kernels, or run with the `gemm`/`conv` allow-list"
                ),
                source="runtime",
            )
        )
    if census.torch_ops and include_torch_ops:
        findings.append(
            Finding(
                code=FindingCode.library_call,
                message=(
                    f"forward launched kernels through PyTorch ops ({', '.join(census.torch_ops[:5])}), also "
                    "from inside compiled code; compute with your own kernels"
                ),
                source="runtime",
            )
        )
    replayed = census.library + census.unattributed
    if census.graph_launches and replayed:
        findings.append(
            Finding(
                code=FindingCode.graph_replay,
                message=(
                    f"forward replayed {census.graph_launches} CUDA graph(s) with library or PyTorch kernels in them "
                    f"({', '.join(n[:60] for n in replayed[:3])}); a graph speeds up library ops without a kernel of "
                    "your own. Capture only your own kernels in a graph, or launch the rest as the reference does"
                ),
                source="runtime",
            )
        )
    if not census.own:
        findings.append(
            Finding(
                code=FindingCode.no_custom_kernel,
                message=(
                    "no kernel of the candidate's own ran during forward "
                    f"({len([x for x in census.launches if x.kind == 'kernel'])} kernel launches, all PyTorch or "
                    "library ones); launch at least one kernel you wrote (load_inline or torch.cuda._compile_kernel)"
                ),
                source="runtime",
            )
        )
    return findings



def expand_runtime_allow(allow: Iterable[str]) -> frozenset[str]:
    """The static allow-list expansion plus library keys (`cublas`, `cudnn`) for groups."""
    out = set(expand_allow(allow))
    for members in ALLOW_GROUPS.values():
        if members <= out:
            out |= members
    return frozenset(out)

