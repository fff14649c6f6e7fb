"""The builders a worker installs for candidates (worker side; imports torch).

`torch.utils.cpp_extension.load_inline` is replaced by a builder that never builds in this
process: an extension is named by the content hash of everything that goes into it
(`toolchain.extension_name`), looked up in the shared cache (`<cache>/torch_extensions`, read-only
in the sandbox), and when missing asked of the pool (`BuildAsk`), whose build service compiles it
in a sandbox of its own, running nothing of the candidate, and publishes it there. So one
candidate can never plant a build another candidate loads, and an identical candidate is a cache
hit. A `.cu` that uses nothing of PyTorch's C++ API is built without `torch/types.h` (the build
service retries with it when the compiler reports unknown names).

`torch.cuda._compile_kernel` (NVRTC, in-process, no files) is wrapped to record each kernel built
and its log; the sandbox is what confines it.

The profiling driver, which has no channel to the pool, builds a missing extension in its own
scratch folder for that one run (`local_dir`); nothing it builds is shared.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kb_mcp.harness.builds.toolchain import (
    DEFAULT_ARCH,
    MESSAGE_LIMIT,
    build_target,
    cuda_arch_list,
    diagnostics,
    extension_name,
    light_variants,
    nvrtc_capability,
    truncate,
)
from kb_mcp.harness.candidate import SourceUnit, inline_unit, kernel_names
from kb_mcp.harness.judgment.verdict import CompileResult, CompileUnit
from kb_mcp.harness.protocol import BuildReply

__all__ = ["DEFAULT_ARCH", "Builders", "load_built", "unit_from_inline_args"]

AskBuild = Callable[[SourceUnit, str], BuildReply]


def unit_from_inline_args(a: dict[str, Any]) -> SourceUnit:
    """The SourceUnit of one `load_inline` call (its bound arguments), read by `candidate.inline_unit`,
    as builds ahead read a call (so both name the build alike)."""
    return inline_unit(a)


def load_built(ext: str, so: Path, python_module: bool) -> Any:
    """Loads a built extension: the Python module, or (a plain library) into torch.ops."""
    if not python_module:
        import torch

        torch.ops.load_library(str(so))
        return str(so)
    loader = importlib.machinery.ExtensionFileLoader(ext, str(so))
    spec = importlib.util.spec_from_file_location(ext, str(so), loader=loader)
    if spec is None:  # pragma: no cover
        raise ImportError(f"cannot load the extension {so}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[ext] = module
    return module


class Builders:
    """Replaces `load_inline` and wraps `torch.cuda._compile_kernel` in this process, recording builds.

    `units` collects what the current candidate built; the worker resets it per candidate. `ask`
    has the pool build a missing extension; without it (`local_dir` given) it is built here, in
    this process's scratch, for this process only.
    """

    def __init__(self, cache_dir: Path, arch: str, ask: AskBuild | None = None, local_dir: Path | None = None) -> None:
        """`arch` is the GPU's (`sm_90`); builds target its arch-specific variant (`toolchain.build_target`)."""
        import torch
        from torch.utils import cpp_extension

        self.ext_dir = cache_dir / "torch_extensions"
        self.arch = build_target(arch or DEFAULT_ARCH)  # e.g. sm_90a: wgmma and TMA code compiles
        self.nvrtc_capability = nvrtc_capability(self.arch)
        self.ask = ask
        self.local_dir = local_dir
        self.units: list[CompileUnit] = []
        # what was built, for the server to read its SASS (`harness.judgment.precision`)
        self.sources: list[SourceUnit] = []
        self._ce = cpp_extension
        self._real_compile_kernel = torch.cuda._compile_kernel
        self._inline_sig = inspect.signature(cpp_extension.load_inline)
        self.torch_version = torch.__version__

    def install(self) -> None:
        """Puts the builders in place (call before any candidate is imported)."""
        import torch

        os.environ["TORCH_CUDA_ARCH_LIST"] = cuda_arch_list(self.arch)
        self._ce.load_inline = self.load_inline
        torch.cuda._compile_kernel = self.compile_kernel
        if hasattr(torch.cuda, "compile_kernel"):
            torch.cuda.compile_kernel = self.compile_kernel

    def reset(self) -> None:
        """Forgets the previous candidate's builds."""
        self.units = []
        self.sources = []

    def _source(self, unit: SourceUnit) -> None:
        if unit not in self.sources:
            self.sources.append(unit)

    def _record(self, unit: CompileUnit) -> None:
        for i, old in enumerate(self.units):
            if (old.kind, old.name) == (unit.kind, unit.name) and old.ok == unit.ok:
                self.units[i] = unit if unit.seconds > old.seconds else old
                return
        self.units.append(unit)

    def compile_kernel(self, kernel_source: str, kernel_name: str, *args: Any, **kwargs: Any) -> Any:
        """`torch.cuda._compile_kernel`, recording the build (and its log when it fails). Without a
        compute capability of the caller's it builds for the GPU's arch-specific target (`90a`)."""
        if not args and kwargs.get("compute_capability") is None:
            kwargs["compute_capability"] = self.nvrtc_capability
        t0 = time.perf_counter()
        try:
            kernel = self._real_compile_kernel(kernel_source, kernel_name, *args, **kwargs)
        except Exception as exc:
            self._record(
                CompileUnit(kind="nvrtc", name=str(kernel_name), ok=False, seconds=time.perf_counter() - t0,
                            kernels=kernel_names(str(kernel_source)), log=truncate(str(exc)))
            )
            raise
        self._record(
            CompileUnit(kind="nvrtc", name=str(kernel_name), seconds=time.perf_counter() - t0,
                        kernels=kernel_names(str(kernel_source)) or [str(kernel_name)])
        )
        opts = kwargs.get("nvcc_options") or (args[2] if len(args) > 2 else None) or []
        incs = kwargs.get("cuda_include_dirs") or (args[1] if len(args) > 1 else None) or []
        self._source(SourceUnit(kind="nvrtc", name=str(kernel_name), cuda_source=str(kernel_source),
                                nvcc_options=[str(o) for o in opts], include_dirs=[str(d) for d in incs]))
        return kernel

    def load_inline(self, *args: Any, **kwargs: Any) -> Any:
        """`load_inline` from the shared cache of published builds, building through the pool on a miss."""
        bound = self._inline_sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        if a.get("sycl_sources"):
            raise RuntimeError("SYCL sources are not supported by the harness")
        unit = unit_from_inline_args(a)
        t0 = time.perf_counter()
        for light in light_variants(unit):
            ext = extension_name(unit, light, self.torch_version, self.arch)
            so = self.ext_dir / ext / f"{ext}.so"
            if so.is_file():
                self._record(CompileUnit(kind="load_inline", name=unit.name, seconds=time.perf_counter() - t0,
                                         cached=True, kernels=kernel_names(unit.cuda_source)))
                self._source(unit)
                return load_built(ext, so, unit.python_module)
        reply = self.ask(unit, self.arch) if self.ask is not None else self._build_here(unit)
        if not reply.ok:
            log = reply.refused or reply.log or "the build failed"
            self._record(CompileUnit(kind="load_inline", name=unit.name, ok=False, seconds=time.perf_counter() - t0,
                                     kernels=kernel_names(unit.cuda_source), log=truncate(log)))
            raise RuntimeError(f"Error building extension '{unit.name}': {log}")
        base = self.local_dir if self.ask is None and self.local_dir is not None else self.ext_dir
        so = base / reply.ext / f"{reply.ext}.so"
        note = "" if reply.light or len(light_variants(unit)) == 1 else \
            "(rebuilt with torch/types.h after a light-header build failed)\n"
        self._record(CompileUnit(kind="load_inline", name=unit.name, seconds=time.perf_counter() - t0,
                                 cached=reply.cached, kernels=kernel_names(unit.cuda_source), log=note))
        self._source(unit)
        return load_built(reply.ext, so, unit.python_module)

    def _build_here(self, unit: SourceUnit) -> BuildReply:
        """A build in this process's own scratch (the profiling driver: nothing is shared)."""
        from kb_mcp.harness.worker.build import build_unit

        if self.local_dir is None:
            return BuildReply(ok=False, log="no build service and no local build folder")
        report = build_unit(unit, self.arch, self.local_dir)
        return BuildReply(ok=report.ok, ext=report.ext, light=report.light, log=report.log, seconds=report.seconds)

    def result(self) -> CompileResult:
        """The CompileResult of the builds recorded since the last reset (`arch`: the build target)."""
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
            style=style,
            arch=self.arch,
            seconds=round(sum(u.seconds for u in units), 4),
            cached=bool(units) and all(u.cached for u in units if u.kind == "load_inline") and "load_inline" in kinds,
            units=units,
            messages=messages[:MESSAGE_LIMIT],
        )
