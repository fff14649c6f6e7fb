"""Building candidates: the builders a worker installs, and the compile-only path for machines
without a GPU. Runs in worker processes only (imports torch lazily).

GPU worker (`Builders.install`): `torch.utils.cpp_extension.load_inline` is replaced by a builder
that names each extension by the content hash of everything that goes into it (sources, flags,
torch version, arch), so an identical candidate is a cache hit and a changed one never reuses a
stale build; it builds only for the present GPU's arch (`TORCH_CUDA_ARCH_LIST`) under
`<cache>/torch_extensions`. When the CUDA sources use nothing of PyTorch's C++ API they are
compiled with only `cuda.h`/`cuda_runtime.h` instead of the implicit `torch/types.h` (the same
object code, tens of seconds faster); if that build fails complaining of unknown names (which the
header might declare), the extension is rebuilt exactly as `load_inline` would, and that build's
diagnostics are the ones reported; other errors would be the same either way and are reported at once.
`torch.cuda._compile_kernel` (NVRTC) is wrapped to record each kernel built and its log.

Compile-only (`capture_units` + `compile_only`): the candidate is imported with the builders
replaced by recorders, its CUDA sources are compiled with `nvcc` for the target arch (and the
`load_inline` C++ part checked with the host compiler), and the diagnostics are returned.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kb_mcp.harness.candidate import SourceUnit, kernel_names, merge_units, style_of
from kb_mcp.harness.verdict import CompileResult, CompileUnit

DEFAULT_ARCH = "sm_90"
LOG_LIMIT = 20_000  # characters of compiler output kept per unit
MESSAGE_LIMIT = 12  # diagnostic lines in CompileResult.messages

# The CUDA source needs PyTorch's C++ headers when it names any of these.
_TORCH_API = re.compile(
    r"\b(torch|at|c10|caffe2|pybind11)::|\bTORCH_\w+|\bAT_\w+|\bC10_\w+|\bTensor\b|\bPYBIND11\w*|#\s*include\s*[<\"](torch|ATen|c10)/"
)
_DIAG = re.compile(r"\b(error|warning)\b", re.I)


class NeedsGPU(RuntimeError):
    """Raised by stand-in builders when candidate code tries to run a kernel on a machine without a GPU."""


def _hash(*parts: object) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _truncate(text: str, limit: int = LOG_LIMIT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters omitted ...]\n{text[-half:]}"


def diagnostics(log: str, limit: int = MESSAGE_LIMIT) -> list[str]:
    """Error lines first, then warnings, from a compiler log (one line each, deduplicated)."""
    errors: list[str] = []
    warnings: list[str] = []
    for raw in log.splitlines():
        line = raw.strip()
        if not line or line.startswith(("[", "FAILED:", "ninja:", "/usr/bin", "c++ ", "nvcc ")) or len(line) > 600:
            continue
        m = _DIAG.search(line)
        if not m:
            continue
        bucket = errors if m.group(1).lower() == "error" else warnings
        if line not in bucket:
            bucket.append(line)
    return (errors + warnings)[:limit]


_MISSING_DECL = re.compile(
    r"is undefined|was not declared|undeclared|incomplete type|has no member|no instance of|not a template|"
    r"unknown type name|does not name a type|is not a member",
    re.I,
)


def missing_declarations(log: str) -> bool:
    """True when a failed light-header build complains of unknown names (which torch/types.h might
    declare); other errors (syntax, types) would fail the same way with the full header."""
    return bool(_MISSING_DECL.search(log))


def needs_torch_headers(cuda_source: str) -> bool:
    """True when CUDA source refers to PyTorch's C++ API (and so needs `torch/types.h`)."""
    return bool(_TORCH_API.search(_strip_comments(cuda_source)))


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)


def _safe_name(name: str) -> str:
    cleaned = re.sub(r"\W", "_", name)[:40] or "ext"
    return cleaned if not cleaned[0].isdigit() else f"x{cleaned}"


def arch_flag(arch: str) -> str:
    """`sm_90` / `90` / `9.0` -> `sm_90`."""
    a = arch.strip().lower().replace("sm_", "").replace("compute_", "").replace(".", "")
    return f"sm_{a}"


# ---------------------------------------------------------------------------------------------
# Source assembly shared by the GPU builder and the compile-only path (mirrors load_inline)


def inline_sources(unit: SourceUnit, light: bool, no_implicit: bool = False, error_handling: bool = True) -> tuple[str, str]:
    """(main.cpp, cuda.cu) text as load_inline would write them; `light` drops torch/types.h from cuda.cu.

    `#line` directives make compiler messages point at lines of the candidate's own strings
    (`cpp_sources:12`, `cuda_sources:40`).
    """
    cpp: list[str] = [] if no_implicit else ["#include <torch/extension.h>"]
    cpp += ['#line 1 "cpp_sources"', unit.cpp_source]
    if unit.functions:
        cpp.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
        for fn in unit.functions:
            wrapped = f"torch::wrap_pybind_function({fn})" if error_handling else fn
            cpp.append(f'm.def("{fn}", {wrapped}, "{fn}");')
        cpp.append("}")
    cuda = ""
    if unit.cuda_source:
        heads: list[str] = []
        if not no_implicit:
            heads = (["#include <torch/types.h>"] if not light else []) + ["#include <cuda.h>", "#include <cuda_runtime.h>"]
        cuda = "\n".join(heads + ['#line 1 "cuda_sources"', unit.cuda_source]) + "\n"
    return "\n".join(cpp) + "\n", cuda


# ---------------------------------------------------------------------------------------------
# GPU worker: the builders candidates call


class Builders:
    """Replaces `load_inline` and wraps `torch.cuda._compile_kernel` in this process, recording builds.

    `units` collects what the current candidate built; the worker resets it per candidate.
    """

    def __init__(self, cache_dir: Path, arch: str) -> None:
        import torch
        from torch.utils import cpp_extension

        self.cache_dir = cache_dir
        self.arch = arch  # e.g. sm_90
        self.units: list[CompileUnit] = []
        self._ce = cpp_extension
        self._real_load_inline = cpp_extension.load_inline
        self._real_load = cpp_extension.load
        self._real_compile_kernel = torch.cuda._compile_kernel
        self._inline_sig = inspect.signature(self._real_load_inline)
        self._torch_version = torch.__version__
        self.ext_dir = cache_dir / "torch_extensions"
        self.src_dir = cache_dir / "inline_src"

    def install(self) -> None:
        """Puts the builders in place (call before any candidate is imported)."""
        import torch

        os.environ["TORCH_EXTENSIONS_DIR"] = str(self.ext_dir)
        cc = self.arch.replace("sm_", "")
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{cc[:-1]}.{cc[-1]}"
        os.environ.setdefault("MAX_JOBS", str(max(2, min(16, os.cpu_count() or 2))))
        self.ext_dir.mkdir(parents=True, exist_ok=True)
        self._ce.load_inline = self.load_inline  # type: ignore[assignment]
        torch.cuda._compile_kernel = self.compile_kernel  # type: ignore[assignment]
        if hasattr(torch.cuda, "compile_kernel"):
            torch.cuda.compile_kernel = self.compile_kernel  # type: ignore[attr-defined]

    def reset(self) -> None:
        """Forgets the previous candidate's builds."""
        self.units = []

    def _record(self, unit: CompileUnit) -> None:
        for i, old in enumerate(self.units):
            if (old.kind, old.name) == (unit.kind, unit.name) and old.ok == unit.ok:
                self.units[i] = unit if unit.seconds > old.seconds else old
                return
        self.units.append(unit)

    def compile_kernel(self, kernel_source: str, kernel_name: str, *args: Any, **kwargs: Any) -> Any:
        """`torch.cuda._compile_kernel`, recording the build (and its log when it fails)."""
        t0 = time.perf_counter()
        try:
            kernel = self._real_compile_kernel(kernel_source, kernel_name, *args, **kwargs)
        except Exception as exc:
            self._record(
                CompileUnit(kind="nvrtc", name=str(kernel_name), ok=False, seconds=time.perf_counter() - t0,
                            kernels=kernel_names(str(kernel_source)), log=_truncate(str(exc)))
            )
            raise
        self._record(
            CompileUnit(kind="nvrtc", name=str(kernel_name), seconds=time.perf_counter() - t0,
                        kernels=kernel_names(str(kernel_source)) or [str(kernel_name)])
        )
        return kernel

    def load_inline(self, *args: Any, **kwargs: Any) -> Any:
        """`load_inline` with content-hash naming, one arch, and light headers where they suffice."""
        bound = self._inline_sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        if a.get("sycl_sources"):
            return self._real_load_inline(*args, **kwargs)
        unit = _unit_from_inline_args(a)
        no_implicit = bool(a.get("no_implicit_headers", False))
        error_handling = bool(a.get("with_pytorch_error_handling", True))
        light_ok = bool(unit.cuda_source) and not no_implicit and not needs_torch_headers(unit.cuda_source)
        attempts = [True, False] if light_ok else [False]
        first_error: Exception | None = None
        t0 = time.perf_counter()
        for light in attempts:
            main_cpp, cuda_cu = inline_sources(unit, light, no_implicit, error_handling)
            key = _hash(main_cpp, cuda_cu, unit.cflags, unit.nvcc_options, a.get("extra_ldflags"), unit.include_dirs,
                        self._torch_version, self.arch, a.get("with_cuda"), a.get("is_python_module"))
            ext = f"{_safe_name(unit.name)}_{key}"
            src = self.src_dir / ext
            src.mkdir(parents=True, exist_ok=True)
            sources = [src / "main.cpp"]
            _write_if_changed(sources[0], main_cpp)
            if cuda_cu:
                sources.append(src / "cuda.cu")
                _write_if_changed(sources[1], cuda_cu)
            cached = (self.ext_dir / ext / f"{ext}.so").exists()
            try:
                module = self._real_load(
                    name=ext,
                    sources=[str(s) for s in sources],
                    extra_cflags=unit.cflags or None,
                    extra_cuda_cflags=unit.nvcc_options or None,
                    extra_ldflags=a.get("extra_ldflags"),
                    extra_include_paths=unit.include_dirs or None,
                    verbose=False,
                    with_cuda=a.get("with_cuda"),
                    is_python_module=a.get("is_python_module", True),
                    keep_intermediates=True,
                )
            except Exception as exc:
                if light and len(attempts) > 1 and missing_declarations(str(exc)):
                    first_error = exc
                    continue
                self._record(
                    CompileUnit(kind="load_inline", name=unit.name, ok=False, seconds=time.perf_counter() - t0,
                                kernels=kernel_names(unit.cuda_source), log=_clean_build_log(str(exc), src))
                )
                raise
            note = "" if light or first_error is None else "(rebuilt with torch/types.h after a light-header build failed)\n"
            self._record(
                CompileUnit(kind="load_inline", name=unit.name, seconds=time.perf_counter() - t0, cached=cached,
                            kernels=kernel_names(unit.cuda_source), log=note)
            )
            return module
        raise AssertionError("unreachable")  # pragma: no cover

    def result(self, arch: str) -> CompileResult:
        """The CompileResult of the builds recorded since the last reset."""
        units = list(self.units)
        ok = all(u.ok for u in units)
        messages: list[str] = []
        for u in units:
            if not u.ok:
                messages += [f"{u.name}: {m}" for m in diagnostics(u.log)] or [f"{u.name}: build failed (see log)"]
        kinds = {u.kind for u in units}
        style = "none" if not kinds else "mixed" if len(kinds) > 1 else next(iter(kinds))
        return CompileResult(
            ok=ok,
            style=style,  # type: ignore[arg-type]
            arch=arch,
            seconds=round(sum(u.seconds for u in units), 4),
            cached=bool(units) and all(u.cached for u in units if u.kind == "load_inline") and "load_inline" in kinds,
            units=units,
            messages=messages[:MESSAGE_LIMIT],
        )


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _clean_build_log(text: str, src_dir: Path) -> str:
    return _truncate(text.replace(str(src_dir) + "/", ""))


def _unit_from_inline_args(a: dict[str, Any]) -> SourceUnit:
    def joined(v: Any) -> str:
        if v is None:
            return ""
        return v if isinstance(v, str) else "\n".join(str(x) for x in v)

    def listed(v: Any) -> list[str]:
        if v is None:
            return []
        return [v] if isinstance(v, str) else [str(x) for x in v]

    functions = a.get("functions")
    if isinstance(functions, dict):
        functions = list(functions)
    return SourceUnit(
        kind="load_inline",
        name=str(a.get("name") or "extension"),
        cuda_source=joined(a.get("cuda_sources")),
        cpp_source=joined(a.get("cpp_sources")),
        functions=listed(functions),
        nvcc_options=listed(a.get("extra_cuda_cflags")),
        cflags=listed(a.get("extra_cflags")),
        include_dirs=listed(a.get("extra_include_paths")),
    )


# ---------------------------------------------------------------------------------------------
# Compile-only: capture what the candidate builds, then compile it with nvcc


class _StubKernel:
    """What `_compile_kernel` returns without a GPU: recorded, and unusable."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise NeedsGPU(f"kernel {self.name} needs a GPU to run")

    def set_shared_memory_config(self, *args: Any, **kwargs: Any) -> None:
        return None


class _StubExtension:
    """What `load_inline` returns without a GPU: any function of it raises NeedsGPU."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Callable[..., Any]:
        if attr.startswith("__"):
            raise AttributeError(attr)

        def stub(*args: Any, **kwargs: Any) -> Any:
            raise NeedsGPU(f"{self._name}.{attr} needs a GPU to run")

        return stub


@contextlib.contextmanager
def capture_units() -> Iterator[list[SourceUnit]]:
    """Within the block, `load_inline` and `_compile_kernel` record their sources and return stand-ins."""
    import torch
    from torch.utils import cpp_extension

    captured: list[SourceUnit] = []
    inline_sig = inspect.signature(cpp_extension.load_inline)
    saved = (cpp_extension.load_inline, torch.cuda._compile_kernel, getattr(torch.cuda, "compile_kernel", None))

    def load_inline(*args: Any, **kwargs: Any) -> Any:
        bound = inline_sig.bind(*args, **kwargs)
        bound.apply_defaults()
        unit = _unit_from_inline_args(dict(bound.arguments))
        captured.append(unit)
        return _StubExtension(unit.name)

    def compile_kernel(kernel_source: str, kernel_name: str, compute_capability: Any = None,
                       cuda_include_dirs: Any = None, nvcc_options: Any = None, *args: Any, **kwargs: Any) -> Any:
        captured.append(
            SourceUnit(kind="nvrtc", name=str(kernel_name), cuda_source=str(kernel_source),
                       nvcc_options=[str(o) for o in nvcc_options or []],
                       include_dirs=[str(d) for d in cuda_include_dirs or []])
        )
        return _StubKernel(str(kernel_name))

    cpp_extension.load_inline = load_inline  # type: ignore[assignment]
    torch.cuda._compile_kernel = compile_kernel  # type: ignore[assignment]
    if saved[2] is not None:
        torch.cuda.compile_kernel = compile_kernel  # type: ignore[attr-defined]
    try:
        yield captured
    finally:
        cpp_extension.load_inline = saved[0]  # type: ignore[assignment]
        torch.cuda._compile_kernel = saved[1]  # type: ignore[assignment]
        if saved[2] is not None:
            torch.cuda.compile_kernel = saved[2]  # type: ignore[attr-defined]


# NVRTC options nvcc understands the same way; others (architecture, NVRTC-only switches) are dropped.
_NVRTC_PASSTHROUGH = (
    "-D", "-U", "-I", "--use_fast_math", "-use_fast_math", "-std", "--std", "-lineinfo", "--maxrregcount",
    "-maxrregcount", "--ftz", "-ftz", "--prec-div", "-prec-div", "--prec-sqrt", "-prec-sqrt", "--fmad",
    "-fmad", "--extra-device-vectorization", "-extra-device-vectorization", "--restrict", "-restrict",
)


def _torch_env() -> dict[str, Any]:
    import sysconfig

    import torch
    from torch.utils import cpp_extension

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return {
        "includes": cpp_extension.include_paths() + [sysconfig.get_paths()["include"]],
        "std": "c++20" if (major, minor) >= (2, 12) else "c++17",
        "nvcc_common": list(cpp_extension.COMMON_NVCC_FLAGS),
        "abi": int(bool(torch._C._GLIBCXX_USE_CXX11_ABI)),
        "version": torch.__version__,
    }


@dataclass(frozen=True)
class _Command:
    """One compiler run checking part of a unit: its source file and argv (relative to its folder)."""

    label: str  # nvcc | c++
    filename: str
    text: str
    argv: tuple[str, ...]

    def key(self, toolchain: str) -> str:
        return _hash(self.label, self.filename, self.text, self.argv, toolchain)


def _commands(unit: SourceUnit, arch: str, env: dict[str, Any], light: bool) -> list[_Command]:
    """The compiler runs that check `unit` (NVRTC source: nvcc; load_inline: nvcc and the host compiler)."""
    nvcc = shutil.which("nvcc") or "nvcc"
    if unit.kind == "nvrtc":
        name = f"{_safe_name(unit.name)}.cu"
        opts = [o for o in unit.nvcc_options if o.startswith(_NVRTC_PASSTHROUGH)]
        if not any(o.startswith(("-std", "--std")) for o in opts):
            opts.append("-std=c++17")
        incs = [f"-I{d}" for d in unit.include_dirs]
        return [_Command("nvcc", name, unit.cuda_source,
                         (nvcc, f"-arch={arch}", "-cubin", "-o", "kernel.cubin", *incs, *opts, name))]
    main_cpp, cuda_cu = inline_sources(unit, light)
    defines = [f"-DTORCH_EXTENSION_NAME={_safe_name(unit.name)}", "-DTORCH_API_INCLUDE_EXTENSION_H",
               f"-D_GLIBCXX_USE_CXX11_ABI={env['abi']}"]
    sys_incs = [x for inc in env["includes"] + unit.include_dirs for x in ("-isystem", inc)]
    cmds: list[_Command] = []
    if cuda_cu:
        cuda_flags = [f for f in unit.nvcc_options if f]
        if not any(f.startswith(("-std", "--std")) for f in cuda_flags):
            cuda_flags.append(f"-std={env['std']}")
        cmds.append(_Command("nvcc", "cuda.cu", cuda_cu, (
            nvcc, f"-arch={arch}", "-c", "-o", "cuda.o", *defines, *sys_incs, *env["nvcc_common"],
            "--compiler-options", "-fPIC", *cuda_flags, "cuda.cu")))
    cxx = shutil.which("c++") or shutil.which("g++") or "c++"
    cmds.append(_Command("c++", "main.cpp", main_cpp, (
        cxx, "-fsyntax-only", *defines, *sys_incs, "-fPIC", f"-std={env['std']}", *[f for f in unit.cflags if f],
        "main.cpp")))
    return cmds


def _run_all(cmds: list[_Command], root: Path, timeout_s: float) -> list[tuple[int, str]]:
    """Runs compiler commands concurrently, each in a folder of its own; (returncode, output) each."""
    procs = []
    for i, cmd in enumerate(cmds):
        work = root / f"c{i}"
        work.mkdir()
        (work / cmd.filename).write_text(cmd.text)
        procs.append(subprocess.Popen(list(cmd.argv), cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, errors="replace", start_new_session=True))
    deadline = time.monotonic() + timeout_s
    out: list[tuple[int, str]] = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            out.append((p.returncode, text))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
            text, _ = p.communicate()
            out.append((-9, (text or "") + f"\n[compiler killed after {timeout_s:.0f} s]"))
    return out


def _compile_commands(cmds: list[_Command], store: Path, toolchain: str, timeout_s: float) -> tuple[list[tuple[int, str]], bool]:
    """Results of `cmds`, from the cache where present; (results, all cached)."""
    results: dict[int, tuple[int, str]] = {}
    todo: list[int] = []
    for i, cmd in enumerate(cmds):
        hit = store / f"{cmd.key(toolchain)}.json"
        if hit.exists():
            data = json.loads(hit.read_text())
            results[i] = (int(data["rc"]), str(data["log"]))
        else:
            todo.append(i)
    if todo:
        with tempfile.TemporaryDirectory(prefix="kbmcp-compile-") as tmp:
            ran = _run_all([cmds[i] for i in todo], Path(tmp), timeout_s)
            for i, (rc, log) in zip(todo, ran):
                log = re.sub(re.escape(tmp) + r"/c\d+/", "", log)
                results[i] = (rc, _truncate(log))
                if rc != -9:  # a killed compiler says nothing about the source: never cache it
                    (store / f"{cmds[i].key(toolchain)}.json").write_text(json.dumps({"rc": rc, "log": results[i][1]}))
    return [results[i] for i in range(len(cmds))], not todo


def compile_only(units: list[SourceUnit], arch: str, cache_dir: Path, timeout_s: float = 600.0) -> CompileResult:
    """Compiles each unit with nvcc for `arch` (and checks load_inline C++ with the host compiler).

    Each compiler run is cached under `<cache>/compile_only`, keyed by its source, flags and
    toolchain, so fixing the CUDA part of an extension does not redo the check of its C++ part.
    A load_inline unit whose CUDA uses nothing of PyTorch's C++ API is first compiled without
    torch/types.h, and again with it if that fails on unknown names (the second one's diagnostics
    are reported then).
    """
    arch = arch_flag(arch)
    if not units:
        return CompileResult(ok=True, style="none", arch=arch, messages=["no CUDA source found to compile"])
    if shutil.which("nvcc") is None:
        return CompileResult(ok=True, style=style_of(units), arch=arch,
                             messages=["nvcc not found: the CUDA sources were found but not compiled"])
    env = _torch_env()
    toolchain = f"{env['version']}|{_nvcc_version()}"
    store = cache_dir / "compile_only"
    store.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    compiled: list[CompileUnit] = []
    # One batch per attempt; units are few, so attempts run unit by unit but commands in parallel.
    for unit in units:
        light_first = unit.kind == "load_inline" and bool(unit.cuda_source) and not needs_torch_headers(unit.cuda_source)
        attempts = [True, False] if light_first else [False]
        t_unit = time.perf_counter()
        for light in attempts:
            cmds = _commands(unit, arch, env, light)
            outs, cached = _compile_commands(cmds, store, toolchain, timeout_s)
            ok = all(rc == 0 for rc, _ in outs)
            retry = not ok and light and len(attempts) > 1 and missing_declarations("\n".join(t for _, t in outs))
            if not retry:
                log = "\n".join(text for _, text in outs if text.strip())
                compiled.append(CompileUnit(kind=unit.kind, name=unit.name, ok=ok, cached=cached,
                                            seconds=round(time.perf_counter() - t_unit, 3),
                                            kernels=kernel_names(unit.cuda_source), log=log))
                break
    messages: list[str] = []
    for u in compiled:
        if not u.ok:
            messages += [f"{u.name}: {m}" for m in diagnostics(u.log)] or [f"{u.name}: compilation failed (see log)"]
    if all(u.ok for u in compiled):
        messages += [f"{u.name}: {m}" for u in compiled for m in diagnostics(u.log)]
    return CompileResult(
        ok=all(u.ok for u in compiled),
        style=style_of(units),
        arch=arch,
        seconds=round(time.perf_counter() - t0, 3),
        cached=all(u.cached for u in compiled),
        units=compiled,
        messages=messages[:MESSAGE_LIMIT],
    )


_NVCC_VERSION: str | None = None


def _nvcc_version() -> str:
    global _NVCC_VERSION
    if _NVCC_VERSION is None:
        try:
            out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30).stdout
            _NVCC_VERSION = out.strip().splitlines()[-1] if out.strip() else "unknown"
        except (OSError, subprocess.TimeoutExpired):
            _NVCC_VERSION = "unknown"
    return _NVCC_VERSION


def all_units(captured: list[SourceUnit], static: list[SourceUnit]) -> list[SourceUnit]:
    """What the candidate builds: units seen at run time, plus statically found ones not seen."""
    return merge_units(captured, static)
