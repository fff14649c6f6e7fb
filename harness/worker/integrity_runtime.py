"""Runtime integrity guards, run inside the worker process around candidate code.

* `OpRecorder`: a TorchDispatchMode that records every ATen op a watched call executes, with the
  candidate's source line, and classifies it as allowed (allocation, views, shape queries, the
  candidate's own custom ops) or a library compute op. Works on CPU tensors as on CUDA ones.
* `TrustedSnapshot`: the identity of every function and class the harness trusts (timers, CUDA
  events, synchronize, comparison functions, Tensor methods, the harness's own modules) and the
  global numerics settings, captured before any candidate is imported and verified after.
* `ThreadCensus`: Python and native threads before and after a call; a thread a candidate leaves
  running is a finding.
* `l2_state` / `reset_l2_persistence`: the L2 persisting set-aside and the current stream's
  access-policy window, read through the CUDA driver.
* `census`: runs one call under the PyTorch profiler and lists the GPU kernels it launched, each
  with the ATen op (if any) that launched it, so the core can tell the candidate's own kernels
  from library kernels (`no_custom_kernel`, `library_call`). Only the census worker runs it: a
  process that times candidates calls `forbid_profiler()` and never starts a profiler session.

`harness.integrity.IntegrityGuard` combines these into a few calls; see its docstring.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch.utils._python_dispatch import TorchDispatchMode

from kb_mcp.harness.integrity_static import ALLOW_GROUPS
from kb_mcp.harness.verdict import Finding, FindingCode

# ---------------------------------------------------------------------------------------------
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

_THIS_DIR = str(Path(__file__).resolve().parent)
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


@dataclass
class OpEvent:
    """One op executed under the recorder: its name and the candidate line that issued it."""

    name: str  # e.g. "aten::mm" or "mylib::fused"
    packet: str  # overload-packet name, e.g. "mm"
    namespace: str
    allowed: bool
    where: str | None = None  # "file.py:42"
    line: int | None = None


def _caller_line(candidate_file: str | None) -> tuple[str | None, int | None]:
    """The innermost frame in the candidate's file (or, without one, outside torch and the harness)."""
    frame: FrameType | None = sys._getframe(2)
    fallback: tuple[str | None, int | None] = (None, None)
    while frame is not None:
        filename = frame.f_code.co_filename
        if candidate_file is not None and filename == candidate_file:
            return f"{Path(filename).name}:{frame.f_lineno}", frame.f_lineno
        if (
            fallback == (None, None)
            and not filename.startswith(_TORCH_DIR)
            and not filename.startswith(_THIS_DIR)
            and not filename.startswith("<")
        ):
            fallback = (f"{Path(filename).name}:{frame.f_lineno}", frame.f_lineno)
        frame = frame.f_back
    return fallback if candidate_file is None else (None, None)


class OpRecorder(TorchDispatchMode):
    """Records the ATen ops a call executes and flags PyTorch compute ops.

    Composite ops are seen as the dispatcher presents them (`linear` under inference mode, its
    `addmm` decomposition otherwise); both spellings are library calls. Ops of other namespaces are
    the candidate's own registered custom ops and are allowed; whatever they call inside is seen by
    `census` (the profiler), not here.
    """

    def __init__(self, allow: Collection[str] = (), candidate_file: str | None = None) -> None:
        super().__init__()
        self.allow = frozenset(allow)
        self.candidate_file = candidate_file
        self.events: list[OpEvent] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket.__name__
        namespace = getattr(func, "namespace", "aten")
        if namespace not in TORCH_NAMESPACES:
            allowed = True
        elif packet in ALLOWED_OPS or packet in self.allow:
            allowed = True
        elif packet in NOOP_ONLY_OPS:
            allowed = any(out is a for a in args)
        else:
            allowed = False
        where, line = _caller_line(self.candidate_file) if not allowed else (None, None)
        self.events.append(OpEvent(f"{namespace}::{packet}", packet, namespace, allowed, where, line))
        return out

    def banned(self) -> list[OpEvent]:
        """The library compute ops recorded so far."""
        return [e for e in self.events if not e.allowed]

    def findings(self) -> list[Finding]:
        """One `library_call` finding per distinct banned op, with a count and source lines."""
        by_op: dict[str, list[OpEvent]] = {}
        for e in self.banned():
            by_op.setdefault(e.name, []).append(e)
        out: list[Finding] = []
        for name, events in by_op.items():
            lines = sorted({e.where for e in events if e.where})
            at = f" at {', '.join(lines[:5])}" if lines else " (no line in the candidate file: issued from compiled or library code)"
            out.append(
                Finding(
                    code=FindingCode.library_call,
                    message=(
                        f"ModelNew.forward ran the PyTorch op {name} ({len(events)}x){at}; compute it in "
                        "your own kernel (allocation, views and kernel launches are fine) or run with an "
                        "allow-list that permits it"
                    ),
                    source="runtime",
                    line=next((e.line for e in events if e.line), None),
                )
            )
        return out


# ---------------------------------------------------------------------------------------------
# Trusted functions and settings


def _watched_modules() -> list[str]:
    names = [
        "builtins", "time", "os", "math", "gc", "threading", "_thread", "struct", "json", "pickle", "hmac",
        "hashlib", "queue", "select", "selectors", "signal",
        "multiprocessing", "multiprocessing.connection", "multiprocessing.reduction",
        "torch", "torch._C", "torch.cuda", "torch.cuda.streams", "torch.cuda.random", "torch.cuda.memory",
        "torch.testing", "torch.testing._comparison", "torch.nn.functional", "torch.nn.modules.module",
        "torch.autograd", "torch.autograd.grad_mode", "torch.random", "torch.utils._python_dispatch",
        "torch.profiler", "torch.autograd.profiler", "numpy", "numpy.testing",
    ]
    names += sorted(n for n in sys.modules if n.startswith("kb_mcp.harness"))
    return [n for n in names if n in sys.modules]


def _watched_classes() -> list[tuple[str, type]]:
    classes: list[tuple[str, type]] = [
        ("torch.Tensor", torch.Tensor),
        ("torch.nn.Module", torch.nn.Module),
        ("torch.nn.Parameter", torch.nn.Parameter),
        ("threading.Thread", threading.Thread),
    ]
    if hasattr(torch, "cuda"):
        classes += [("torch.cuda.Event", torch.cuda.Event), ("torch.cuda.Stream", torch.cuda.Stream)]
    conn = sys.modules.get("multiprocessing.connection")
    if conn is not None:
        classes += [("multiprocessing.connection.Connection", conn.Connection)]
    for modname in sorted(n for n in sys.modules if n.startswith("kb_mcp.harness")):
        module = sys.modules[modname]
        for attr, value in list(vars(module).items()):
            if isinstance(value, type) and getattr(value, "__module__", "") == modname:
                classes.append((f"{modname}.{attr}", value))
    return classes


def _is_watched_value(value: object) -> bool:
    """Functions, methods, classes, modules and descriptors: what a cheat would swap out (not data)."""
    if isinstance(value, (int, float, complex, str, bytes, bool, type(None), dict, list, set, tuple, frozenset)):
        return False
    return callable(value) or isinstance(value, (ModuleType, property, staticmethod, classmethod))


def _settings() -> dict[str, Callable[[], object]]:
    """Global numerics and runtime settings the reference shares with the candidate."""
    s: dict[str, Callable[[], object]] = {
        "torch.get_default_dtype()": torch.get_default_dtype,
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision,
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled,
        "torch.backends.cuda.matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": (
            lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        ),
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": (
            lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        ),
        "torch.backends.cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
        "torch.backends.cudnn.enabled": lambda: torch.backends.cudnn.enabled,
        "torch.backends.cudnn.benchmark": lambda: torch.backends.cudnn.benchmark,
        "torch.backends.cudnn.deterministic": lambda: torch.backends.cudnn.deterministic,
        "sys.gettrace()": sys.gettrace,
        "sys.getprofile()": sys.getprofile,
    }
    return s


def _describe(value: object) -> str:
    code = getattr(value, "__code__", None)
    if code is not None:
        return f"{getattr(value, '__qualname__', type(value).__name__)} from {Path(code.co_filename).name}:{code.co_firstlineno}"
    return f"{type(value).__name__} {getattr(value, '__qualname__', '')}".strip()


@dataclass(frozen=True)
class Trusted:
    """The timer, event, synchronize and comparison functions, as they were before any candidate.

    The core calls these instead of looking names up at call time, so a candidate that replaces
    `torch.cuda.Event.elapsed_time` cannot change what the harness measures.
    """

    perf_counter: Callable[[], float]
    perf_counter_ns: Callable[[], int]
    monotonic: Callable[[], float]
    synchronize: Callable[..., None]
    event_cls: type
    event_record: Callable[..., None]
    event_synchronize: Callable[..., None]
    event_elapsed_time: Callable[..., float]
    current_stream: Callable[..., Any]
    allclose: Callable[..., bool]
    isclose: Callable[..., torch.Tensor]
    isfinite: Callable[..., torch.Tensor]
    equal: Callable[..., bool]


@dataclass(frozen=True)
class TrustedSnapshot:
    """Identity of trusted functions and values of global settings, captured before any candidate.

    Capture once per worker, before the first candidate is imported; `verify()` after each
    candidate lists whatever changed as `harness_tampering` (or `precision_lowered` for numerics
    flags). The stored entries are tuples: a candidate cannot edit them in place.
    """

    entries: tuple[tuple[str, str, object], ...]  # (owner, attribute, original value)
    owners: tuple[tuple[str, object], ...]  # owner name -> the module/class object itself
    settings: tuple[tuple[str, object], ...]
    trusted: Trusted

    @classmethod
    def capture(cls) -> TrustedSnapshot:
        """Snapshot of the current process: call before importing any candidate."""
        # PyTorch rebinds a few of its own functions when torch._dynamo is first imported (which
        # the first dispatch mode does); import it now so that this is not mistaken for tampering.
        import torch._dynamo  # noqa: F401

        # PyTorch starts its CPU thread pool on the first parallel op; start it now, so that the
        # thread census does not blame the first candidate that runs a CPU op for it.
        torch.ones(1 << 20).exp_().sum()
        entries: list[tuple[str, str, object]] = []
        owners: list[tuple[str, object]] = []
        for name in _watched_modules():
            module = sys.modules[name]
            owners.append((name, module))
            for attr, value in list(vars(module).items()):
                if attr.startswith("__") and attr not in {"__import__", "__build_class__"}:
                    continue
                if _is_watched_value(value):
                    entries.append((name, attr, value))
        for name, klass in _watched_classes():
            owners.append((name, klass))
            for attr, value in list(vars(klass).items()):
                if attr in {"__dict__", "__weakref__", "__doc__", "__module__", "__annotations__"}:
                    continue
                if _is_watched_value(value) or hasattr(value, "__get__"):
                    entries.append((name, attr, value))
        settings = tuple((k, _safe(getter)) for k, getter in _settings().items())
        import time

        trusted = Trusted(
            perf_counter=time.perf_counter,
            perf_counter_ns=time.perf_counter_ns,
            monotonic=time.monotonic,
            synchronize=torch.cuda.synchronize,
            event_cls=torch.cuda.Event,
            event_record=torch.cuda.Event.record,
            event_synchronize=torch.cuda.Event.synchronize,
            event_elapsed_time=torch.cuda.Event.elapsed_time,
            current_stream=torch.cuda.current_stream,
            allclose=torch.allclose,
            isclose=torch.isclose,
            isfinite=torch.isfinite,
            equal=torch.equal,
        )
        return cls(tuple(entries), tuple(owners), settings, trusted)

    def changes(self) -> list[tuple[str, str, object, object]]:
        """(owner, attribute, original, now) for every replaced or deleted trusted attribute."""
        out: list[tuple[str, str, object, object]] = []
        missing = object()
        owner_objs = dict(self.owners)
        for owner, attr, original in self.entries:
            holder = owner_objs[owner]
            try:
                now = vars(holder).get(attr, missing)
            except TypeError:  # pragma: no cover - objects without __dict__
                continue
            if now is not original:
                out.append((owner, attr, original, now))
        for owner, obj in self.owners:
            if isinstance(obj, ModuleType) and sys.modules.get(owner, obj) is not obj:
                out.append(("sys.modules", owner, obj, sys.modules.get(owner)))
        return out

    def setting_changes(self) -> list[tuple[str, object, object]]:
        """(setting, original, now) for every global setting that differs from the capture."""
        getters = _settings()
        return [(k, v, _safe(getters[k])) for k, v in self.settings if _safe(getters[k]) != v]

    def verify(self) -> list[Finding]:
        """Findings for every trusted function replaced and every global setting changed."""
        findings: list[Finding] = []
        for owner, attr, _original, now in self.changes():
            what = "deleted" if now is None else f"replaced by {_describe(now)}"
            findings.append(
                Finding(
                    code=FindingCode.harness_tampering,
                    message=(
                        f"`{owner}.{attr}` was {what}; the harness's timers, synchronize, comparison "
                        "and library functions must stay as they were. Remove the patch"
                    ),
                    source="runtime",
                )
            )
        for key, before, after in self.setting_changes():
            precision = "tf32" in key or "precision" in key or "default_dtype" in key
            findings.append(
                Finding(
                    code=FindingCode.precision_lowered if precision else FindingCode.harness_tampering,
                    message=(
                        f"the global setting `{key}` changed from {before!r} to {after!r} while the "
                        "candidate ran; it also governs the reference and the harness. Leave global "
                        "settings alone"
                    ),
                    source="runtime",
                )
            )
        return findings

    def restore(self) -> None:
        """Best-effort undo of replaced functions (the worker should still be retired after tampering)."""
        owner_objs = dict(self.owners)
        for owner, attr, original, _now in self.changes():
            if owner == "sys.modules":
                sys.modules[attr] = original  # type: ignore[assignment]
                continue
            try:
                setattr(owner_objs[owner], attr, original)
            except (AttributeError, TypeError):  # pragma: no cover - read-only owners
                pass


def _safe(getter: Callable[[], object]) -> object:
    try:
        return getter()
    except Exception as exc:  # a setting that cannot be read (no CUDA) is compared as its error
        return f"<unreadable: {type(exc).__name__}>"


# ---------------------------------------------------------------------------------------------
# Threads

# Native threads the CUDA driver and runtime start on their own (event handler, JIT, ...).
DRIVER_THREAD_PREFIXES: tuple[str, ...] = ("cuda", "nvrtc", "nvjitlink", "cupti", "pt_", "torch", "ncu")


def _native_threads() -> dict[int, str]:
    out: dict[int, str] = {}
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                out[int(tid)] = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            except OSError:
                continue
    except OSError:  # pragma: no cover - not Linux
        pass
    return out


@dataclass(frozen=True)
class ThreadCensus:
    """The Python and native threads alive at one moment."""

    python: frozenset[threading.Thread]
    native: dict[int, str]

    @classmethod
    def take(cls) -> ThreadCensus:
        """Census of the current process."""
        return cls(frozenset(threading.enumerate()), _native_threads())

    def new_since(self, earlier: ThreadCensus) -> tuple[list[threading.Thread], dict[int, str]]:
        """Threads alive now that were not alive at `earlier` (Python threads, other native ones)."""
        py = [t for t in self.python if t not in earlier.python and t.is_alive()]
        py_native = {t.native_id for t in py}
        native = {
            tid: name
            for tid, name in self.native.items()
            if tid not in earlier.native and tid not in py_native and not name.lower().startswith(DRIVER_THREAD_PREFIXES)
        }
        return py, native


def thread_findings(before: ThreadCensus, after: ThreadCensus, phase: str) -> list[Finding]:
    """`background_thread` findings for threads started during `phase` and still running after it."""
    py, native = after.new_since(before)
    for _ in range(10):
        # A thread that was joined can linger in /proc for a moment while the OS reaps it.
        if not native:
            break
        time.sleep(0.005)
        py, native = ThreadCensus.take().new_since(before)
    findings: list[Finding] = []
    if py:
        names = ", ".join(sorted(f"{t.name} (target {_describe(getattr(t, '_target', None) or t.run)})" for t in py))
        findings.append(
            Finding(
                code=FindingCode.background_thread,
                message=(
                    f"{len(py)} Python thread(s) started during {phase} were still running after it "
                    f"returned: {names}. Work in a background thread escapes the timer; do it inside forward"
                ),
                source="runtime",
            )
        )
    if native:
        findings.append(
            Finding(
                code=FindingCode.background_thread,
                message=(
                    f"{len(native)} native thread(s) started during {phase} were still running after it "
                    f"returned ({', '.join(sorted(set(native.values())))}). Work in a background thread "
                    "escapes the timer; do it inside forward"
                ),
                source="runtime",
            )
        )
    return findings


# ---------------------------------------------------------------------------------------------
# L2 persistence (CUDA driver API)

CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06
CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1


class L2State(BaseModel):
    """The L2 persisting set-aside and the access-policy window of the streams checked."""

    model_config = ConfigDict(extra="forbid")

    persisting_limit_bytes: int | None = None  # None when the driver could not be asked
    window_bytes: dict[str, int] = Field(default_factory=dict)  # stream label -> window size
    error: str | None = None

    @property
    def persistent(self) -> bool:
        """True when some L2 lines can persist across the harness's flush."""
        return bool(self.persisting_limit_bytes) or any(v > 0 for v in self.window_bytes.values())


def _libcuda() -> ctypes.CDLL:
    try:
        from torch.cuda._utils import _get_gpu_runtime_library

        return _get_gpu_runtime_library()
    except Exception:
        return ctypes.CDLL("libcuda.so.1")


def _streams() -> list[tuple[str, int]]:
    current = torch.cuda.current_stream()
    default = torch.cuda.default_stream()
    out = [("current", int(current.cuda_stream))]
    if int(default.cuda_stream) != int(current.cuda_stream):
        out.append(("default", int(default.cuda_stream)))
    return out


def l2_state() -> L2State:
    """Reads the persisting-L2 limit and each checked stream's access-policy window size."""
    if not torch.cuda.is_available():
        return L2State(error="no CUDA device")
    try:
        lib = _libcuda()
        value = ctypes.c_size_t(0)
        rc = lib.cuCtxGetLimit(ctypes.byref(value), ctypes.c_int(CU_LIMIT_PERSISTING_L2_CACHE_SIZE))
        if rc != 0:
            return L2State(error=f"cuCtxGetLimit returned {rc}")
        windows: dict[str, int] = {}
        for label, handle in _streams():
            buf = (ctypes.c_ubyte * 64)()  # CUlaunchAttributeValue is a 64-byte union
            rc = lib.cuStreamGetAttribute(
                ctypes.c_void_p(handle), ctypes.c_int(CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW), ctypes.byref(buf)
            )
            if rc == 0:
                # accessPolicyWindow: void* base_ptr; size_t num_bytes; float hitRatio; ...
                windows[label] = int.from_bytes(bytes(buf[8:16]), "little")
        return L2State(persisting_limit_bytes=int(value.value), window_bytes=windows)
    except Exception as exc:  # pragma: no cover - driver missing or symbol absent
        return L2State(error=f"{type(exc).__name__}: {exc}")


def reset_l2_persistence() -> None:
    """Clears the persisting set-aside, the checked streams' windows and any persisting lines."""
    if not torch.cuda.is_available():
        return
    lib = _libcuda()
    for _label, handle in _streams():
        buf = (ctypes.c_ubyte * 64)()
        lib.cuStreamSetAttribute(
            ctypes.c_void_p(handle), ctypes.c_int(CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW), ctypes.byref(buf)
        )
    lib.cuCtxResetPersistingL2Cache()
    lib.cuCtxSetLimit(ctypes.c_int(CU_LIMIT_PERSISTING_L2_CACHE_SIZE), ctypes.c_size_t(0))


def l2_findings(state: L2State) -> list[Finding]:
    """`l2_persistence` when a persisting set-aside or access-policy window is in place."""
    if not state.persistent:
        return []
    return [
        Finding(
            code=FindingCode.l2_persistence,
            message=(
                f"after the candidate ran, L2 persistence was configured (persisting set-aside "
                f"{state.persisting_limit_bytes} bytes, access-policy windows {state.window_bytes}); "
                "persisting lines survive the harness's L2 flush and make timings unrepresentative. "
                "Remove cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize) and access-policy windows"
            ),
            source="runtime",
        )
    ]


# ---------------------------------------------------------------------------------------------
# Kernel census: which kernels ran, and who launched them

ANNOTATION = "kbmcp::candidate_forward"

# Kernel names of vendor libraries (cuBLAS, cuBLASLt, cuDNN, cuFFT) and of PyTorch's own kernels.
_VENDOR_KERNEL = re.compile(
    r"^(void\s+)?(sm\d+_xmma_|xmma_|nvjet_|ampere_|volta_|turing_|maxwell_|hopper_|sm\d+_sgemm|gemmSN_|"
    r"gemmk1_|gemv2[NT]_|gemvNSP|gemvx|dot_kernel|scal_kernel|splitKreduce_|implicit_convolve_|cudnn|"
    r"cublas|fft2d_|fft3d_|regular_fft|vector_fft|winograd|precomputed_convolve|explicit_convolve|"
    r"conv2d_grouped_direct|cutlass_\d+_)"
    r"|\b(cudnn|cublas|cublasLt|cufft)\w*::|cutlass_\d+_(simt|tensorop|wmma)|\bcublas",
)
_TORCH_KERNEL = re.compile(r"\bat::native::|\bat::cuda::|at_cuda_detail|\bc10::|\bat::\(anonymous")


class KernelLaunch(BaseModel):
    """One GPU kernel (or memset/memcpy) seen during a censused call."""

    model_config = ConfigDict(extra="forbid")

    name: str
    op: str | None = None  # innermost PyTorch op that launched it (e.g. "aten::mm"); None = none
    kind: str = "kernel"  # kernel | memcpy | memset


class KernelCensus(BaseModel):
    """The kernels one call launched, sorted into the candidate's own and library ones."""

    model_config = ConfigDict(extra="forbid")

    available: bool  # False when the profiler could not see GPU activity (no GPU, no CUPTI)
    launches: list[KernelLaunch] = Field(default_factory=list)
    own: list[str] = Field(default_factory=list)  # kernels of the candidate's own
    library: list[str] = Field(default_factory=list)  # vendor-library kernels launched outside any PyTorch op
    torch_ops: list[str] = Field(default_factory=list)  # PyTorch ops that launched kernels
    unattributed: list[str] = Field(default_factory=list)  # PyTorch kernels whose launching op the profiler lost
    note: str = ""


def classify_launches(
    launches: Iterable[KernelLaunch], allow: Collection[str] = (), available: bool = True
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
        available=available, launches=launches, own=own, library=library, torch_ops=torch_ops, unattributed=unattributed
    )


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


# A process that times candidates must never start a profiler session: after one, CUPTI can keep
# the host cost of every launch raised for the rest of the process (on an H100, eager
# elementwise_chain_small timed 0.62 ms in such a worker against 0.40 ms in a clean process), which
# inflates launch-bound baselines more than fused candidates and so overstates speedups. Timing
# workers call `forbid_profiler()` at start; the kernel census runs in a census worker of its own
# (`harness.census`).
_PROFILER_STATE = {"forbidden": False, "sessions": 0}


class ProfilerForbidden(RuntimeError):
    """A profiler session was asked for in a process that times candidates."""


def forbid_profiler() -> None:
    """Makes every later `profile_events` in this process raise `ProfilerForbidden`."""
    _PROFILER_STATE["forbidden"] = True


def profiler_sessions() -> int:
    """How many profiler sessions the harness started in this process."""
    return int(_PROFILER_STATE["sessions"])


class ProfilerEvent(BaseModel):
    """The fields of one raw profiler event that a census needs (recordable as a test fixture)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    device: str  # "cpu" | "cuda"
    correlation_id: int
    linked_correlation_id: int
    activity: str = ""  # e.g. "cpu_op", "kernel", "gpu_memcpy"; "" where this torch does not say


def profile_events(call: Callable[[], Any]) -> list[ProfilerEvent]:
    """Runs `call` once under the profiler (inside the `ANNOTATION` range) and returns its raw events."""
    from torch.profiler import ProfilerActivity, profile, record_function

    if _PROFILER_STATE["forbidden"]:
        raise ProfilerForbidden(
            "this process times candidates and must stay free of profiler sessions; the kernel census "
            "runs in the census worker (harness.census)"
        )
    _PROFILER_STATE["sessions"] += 1
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        with record_function(ANNOTATION):
            call()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return [
        ProfilerEvent(
            name=e.name(),
            device=_device_type(e),
            correlation_id=int(e.correlation_id()),
            linked_correlation_id=int(e.linked_correlation_id()),
            activity=_activity(e),
        )
        for e in prof.profiler.kineto_results.events()
    ]


def launches_from_events(events: Iterable[ProfilerEvent]) -> list[KernelLaunch]:
    """GPU kernels (and copies/sets) among the events, each with the innermost op that launched it.

    A device event's `linked_correlation_id` is the id of the CPU op on top of the stack when it
    was launched. Only named ops (`ns::name`) are taken as launchers: the profiler's own CPU
    records ("Activity Buffer Request", "cudaLaunchKernel") can share ids with them.
    """
    events = list(events)
    ops: dict[int, str] = {}
    for e in events:
        if e.device == "cpu" and e.correlation_id > 0 and "::" in e.name and e.correlation_id not in ops:
            ops[e.correlation_id] = e.name
    launches: list[KernelLaunch] = []
    for e in events:
        if e.device != "cuda" or e.name == ANNOTATION:
            continue
        activity = e.activity
        if "memcpy" in activity or (not activity and e.name.startswith("Memcpy")):
            kind = "memcpy"
        elif "memset" in activity or (not activity and e.name.startswith("Memset")):
            kind = "memset"
        elif "kernel" in activity or not activity:
            kind = "kernel"
        else:
            continue  # GPU-side annotation ranges, synchronisation records, ...
        op = ops.get(e.linked_correlation_id)
        launches.append(KernelLaunch(name=e.name, op=None if op in (None, ANNOTATION) else op, kind=kind))
    return launches


def record_launches(call: Callable[[], Any]) -> tuple[list[KernelLaunch], bool]:
    """Runs `call` once under the profiler; returns its kernel launches and whether GPU activity was visible."""
    events = profile_events(call)
    gpu_seen = any(e.device == "cuda" for e in events)
    return launches_from_events(events), gpu_seen or not torch.cuda.is_available()


def _device_type(event: Any) -> str:
    return str(event.device_type()).rsplit(".", 1)[-1].lower()


def _activity(event: Any) -> str:
    getter = getattr(event, "activity_type", None)
    try:
        return str(getter()).lower() if getter else ""
    except Exception:  # pragma: no cover - a torch without it
        return ""


def census(call: Callable[[], Any], allow: Collection[str] = ()) -> KernelCensus:
    """Kernel census of one call (GPU): own kernels, library kernels, PyTorch ops that launched kernels."""
    if not torch.cuda.is_available():
        return KernelCensus(available=False, note="no CUDA device: kernel census skipped")
    try:
        launches, visible = record_launches(call)
    except ProfilerForbidden:
        raise
    except Exception as exc:  # the profiler can be unavailable; the dispatch-mode guard still ran
        return KernelCensus(available=False, note=f"profiler unavailable: {type(exc).__name__}: {exc}")
    if not visible:
        return KernelCensus(available=False, launches=launches, note="the profiler saw no GPU activity")
    result = classify_launches(launches, allow)
    return result


def expand_runtime_allow(allow: Iterable[str]) -> frozenset[str]:
    """The static allow-list expansion plus library keys (`cublas`, `cudnn`) for groups."""
    from kb_mcp.harness.integrity_static import expand_allow

    out = set(expand_allow(allow))
    for group, members in ALLOW_GROUPS.items():
        if members <= out:
            out |= members
    return frozenset(out)


def check_model_class(model_new: type, reference: type | None) -> list[Finding]:
    """`reference_fallback` if ModelNew subclasses the reference (or any class named Model)."""
    findings: list[Finding] = []
    for base in model_new.__mro__[1:]:
        if base is reference or (base.__name__ == "Model" and base.__module__ != "torch.nn.modules.module"):
            findings.append(
                Finding(
                    code=FindingCode.reference_fallback,
                    message=(
                        f"ModelNew subclasses `{base.__module__}.{base.__name__}`, the reference; it must "
                        "compute the result itself"
                    ),
                    source="runtime",
                )
            )
            break
    return findings


def check_model_instance(model: torch.nn.Module, reference: type | None) -> list[Finding]:
    """`reference_fallback` if a ModelNew instance holds a reference Model inside it."""
    if reference is None:
        return []
    for name, sub in model.named_modules():
        if sub is not model and isinstance(sub, reference):
            return [
                Finding(
                    code=FindingCode.reference_fallback,
                    message=f"ModelNew holds an instance of the reference Model as `{name}`; it must compute the result itself",
                    source="runtime",
                )
            ]
    return []
