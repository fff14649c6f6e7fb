"""The trusted snapshot (worker side): the identity of every function and class the harness relies on
(timers, CUDA events, synchronize, comparison functions, Tensor and Module methods, the harness's own
modules) and the global numerics settings, captured before any candidate is imported and compared
after each one."""

from __future__ import annotations

import dataclasses
import enum
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kb_mcp.harness.judgment.verdict import Finding, FindingCode


def _watched_modules() -> list[str]:
    names = [
        "builtins", "time", "os", "math", "gc", "threading", "_thread", "struct", "json", "pickle", "hmac",
        "hashlib", "queue", "select", "selectors", "signal",
        "multiprocessing", "multiprocessing.connection", "multiprocessing.reduction",
        "torch", "torch._C", "torch.cuda", "torch.cuda.streams", "torch.cuda.random", "torch.cuda.memory",
        "torch.testing", "torch.testing._comparison", "torch.nn.functional", "torch.nn.modules.module",
        "torch.autograd", "torch.autograd.grad_mode", "torch.random", "torch.utils._python_dispatch",
        "torch.profiler", "torch.autograd.profiler", "numpy", "numpy.testing",
        # what the census's kernel list and device time are read from (`worker.profiling`)
        "torch.profiler.profiler", "torch.autograd.profiler_util", "torch._C._autograd", "torch._C._profiler",
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
    classes += _profiler_classes()
    conn = sys.modules.get("multiprocessing.connection")
    if conn is not None:
        classes += [("multiprocessing.connection.Connection", conn.Connection)]
    for modname in sorted(n for n in sys.modules if n.startswith("kb_mcp.harness")):
        module = sys.modules[modname]
        for attr, value in list(vars(module).items()):
            if isinstance(value, type) and getattr(value, "__module__", "") == modname:
                classes.append((f"{modname}.{attr}", value))
    return classes


def _profiler_classes() -> list[tuple[str, type]]:
    """The profiler's classes the census reads its kernels and durations through: a candidate that
    rescales `_KinetoEvent.duration_ns` would otherwise fake its own device time (and, in a census
    worker that outlives it, later ones')."""
    import torch.autograd.profiler as autograd_profiler
    import torch.profiler as profiler

    names = {
        "torch._C._autograd._KinetoEvent": getattr(torch._C._autograd, "_KinetoEvent", None),
        "torch._C._autograd._ProfilerResult": getattr(torch._C._autograd, "_ProfilerResult", None),
        "torch.profiler.profile": profiler.profile,
        "torch.profiler.profiler._KinetoProfile": getattr(profiler.profiler, "_KinetoProfile", None),
        "torch.autograd.profiler.profile": autograd_profiler.profile,
        "torch.autograd.profiler.record_function": autograd_profiler.record_function,
    }
    return [(name, klass) for name, klass in names.items() if isinstance(klass, type)]


# Module-level state of the harness that changes while it works (caches, the profiler's counters):
# not a table a candidate could loosen.
_MUTABLE_STATE = frozenset({"_PROBED", "_PROFILER_STATE", "_LAUNCHER"})


def _harness_tables() -> list[tuple[str, str, object]]:
    """The harness's own data (tolerances, device peaks, run counts, allow-lists): (module, name, value)
    for every module-level value of its modules that is not code. A candidate that loosened one of
    them (`DEFAULT_TOLERANCES["float32"] = (1, 1)`) would loosen its own checks."""
    out = []
    for name in sorted(n for n in sys.modules if n.startswith("kb_mcp.harness")):
        for attr, value in list(vars(sys.modules[name]).items()):
            if attr.startswith("__") or attr in _MUTABLE_STATE or _is_watched_value(value):
                continue
            out.append((name, attr, value))
    return out


_PLAIN = (int, float, complex, str, bytes, bool, type(None), enum.Enum, tuple, list, dict, set, frozenset)


def _fingerprint(value: object) -> str:
    """What a table holds, to see it edited in place (its identity stays). Only plain data: other
    objects (a lock says whether it is held, a compiled pattern cannot be edited) count by identity."""
    if not isinstance(value, _PLAIN):
        return ""
    try:
        return repr(value)
    except Exception as exc:  # noqa: BLE001 - an object whose repr fails is compared by identity only
        return f"<unrepresentable {type(exc).__name__}>"


def _is_watched_value(value: object) -> bool:
    """Functions, methods, classes, modules and descriptors: what a cheat would swap out (not data)."""
    if isinstance(value, _PLAIN):
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
        "torch.is_anomaly_enabled()": torch.is_anomaly_enabled,
    }
    for module in _COMPILER_CONFIGS:
        s[f"{module} (its hash)"] = _config_hash(module)
    # Which attention and linear-algebra kernels the reference's own ops pick: switched off or
    # steered elsewhere, they slow the reference where it is timed beside the candidate.
    for name in _BACKEND_CHOICES:
        getter = getattr(torch.backends.cuda, name, None)
        if callable(getter):
            s[f"torch.backends.cuda.{name}()"] = getter
    return s


# torch.compile's own settings (what it fuses, whether it runs at all): the baselines' figure
_COMPILER_CONFIGS = ("torch._dynamo.config", "torch._inductor.config")


def _config_hash(module: str) -> Callable[[], object]:
    def read() -> object:
        import importlib

        return importlib.import_module(module).get_hash()
    return read


def compiler_settings() -> tuple[object, ...]:
    """torch.compile's settings as they are now (dynamo's and inductor's, by their hashes)."""
    return tuple(_safe(_config_hash(m)) for m in _COMPILER_CONFIGS)


_BACKEND_CHOICES = ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled",
                    "preferred_linalg_library", "preferred_blas_library")


def describe(value: object) -> str:
    code = getattr(value, "__code__", None)
    if code is not None:
        return (f"{getattr(value, '__qualname__', type(value).__name__)} from "
                f"{Path(code.co_filename).name}:{code.co_firstlineno}")
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
    tables: tuple[tuple[str, str, object, str], ...] = ()  # (module, name, value, fingerprint): the harness's data

    @classmethod
    def capture(cls) -> TrustedSnapshot:
        """Snapshot of the current process: call before importing any candidate."""
        # PyTorch rebinds a few of its own functions when torch._dynamo is first imported (which
        # the first dispatch mode does); import it now so that this is not mistaken for tampering.
        import torch._dynamo

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
        tables = tuple((m, a, v, _fingerprint(v)) for m, a, v in _harness_tables())
        return cls(tuple(entries), tuple(owners), settings, trusted, tables)

    def with_settings_now(self, keys: tuple[str, ...]) -> TrustedSnapshot:
        """This snapshot with the settings `keys` as they are now: the harness set them itself (a
        precision track's TF32 mode, `worker.tracks`), so they are the state to hold the candidate to."""
        getters = _settings()
        settings = tuple((k, _safe(getters[k]) if k in keys else v) for k, v in self.settings)
        return dataclasses.replace(self, settings=settings)

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

    def table_changes(self) -> list[tuple[str, str]]:
        """(module, name) for every table of the harness rebound, deleted or edited in place."""
        missing = object()
        out = []
        for module, attr, original, print_ in self.tables:
            now = vars(sys.modules[module]).get(attr, missing) if module in sys.modules else missing
            if now is not original or _fingerprint(now) != print_:
                out.append((module, attr))
        return out

    def verify(self) -> list[Finding]:
        """Findings for every trusted function replaced, harness table changed and global setting changed."""
        findings: list[Finding] = [
            Finding(
                code=FindingCode.harness_tampering,
                message=(f"`{module}.{attr}` was changed; the harness's tolerances, limits and tables must "
                         "stay as they were. Leave the harness's modules alone"),
                source="runtime",
            )
            for module, attr in self.table_changes()
        ]
        for owner, attr, _original, now in self.changes():
            what = "deleted" if now is None else f"replaced by {describe(now)}"
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
            findings.append(
                Finding(
                    code=setting_code(key),
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
        """Best-effort undo of replaced functions and rebound tables (a table edited in place stays so:
        the worker must be retired after tampering in any case)."""
        changed = set(self.table_changes())
        for module, attr, original, _print in self.tables:
            if (module, attr) in changed and module in sys.modules:
                setattr(sys.modules[module], attr, original)
        owner_objs = dict(self.owners)
        for owner, attr, original, _now in self.changes():
            if owner == "sys.modules":
                sys.modules[attr] = original  # type: ignore[assignment]
                continue
            try:
                setattr(owner_objs[owner], attr, original)
            except (AttributeError, TypeError):  # pragma: no cover - read-only owners
                pass


# Settings that speed up library ops (the reference's too) without a kernel of the candidate's own:
# each has a finding of its own (docs/harness.md, "Composed mode"), whatever the mode.
_TF32_SWITCHES = ("torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32",
                  "torch.get_float32_matmul_precision()")


def setting_code(key: str) -> FindingCode:
    """The finding a changed global setting is: a TF32 switch, cuDNN's benchmark mode, another
    lowered precision (reduced-precision reductions, the default dtype), or tampering."""
    if key in _TF32_SWITCHES:
        return FindingCode.tf32_switch
    if key == "torch.backends.cudnn.benchmark":
        return FindingCode.cudnn_benchmark
    if "precision" in key or "default_dtype" in key:
        return FindingCode.precision_lowered
    return FindingCode.harness_tampering


def _safe(getter: Callable[[], object]) -> object:
    try:
        return getter()
    except Exception as exc:  # noqa: BLE001 - a setting that cannot be read (no CUDA) is compared as its error
        return f"<unreadable: {type(exc).__name__}>"
