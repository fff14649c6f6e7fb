"""Builds ahead (server side): a candidate's builds made before its verification asks for them.

An eval (`campaign.evaluate`) verifies one solution at a time on the GPU. Building the next solutions'
`load_inline` extensions meanwhile, on the CPU cores the verification leaves idle, hides their cold
builds (tens of seconds each) behind it. A build ahead goes through a build service like the pool's
(`harness.builds.builds`: the same sandbox, flag checks, shared cache and content-hash names), for the GPU
arch and torch version the pool's worker reported, so the worker's lookup finds the extension
published and asks for nothing. Only what the syntax tree makes certain is built
(`candidate.inline_units_ahead`, read by the same `candidate.inline_unit` as the worker's); anything
computed at run time is built on demand, as always. NVRTC kernels need nothing ahead: the worker
compiles them in a twentieth of a second.

A build ahead is never a verdict: nothing reads its outcome but progress and counts. A build that
fails is not published, so the worker asks for it again and the verification reports the
compiler's error exactly as it would have without it.

In compile-only mode (no GPU, or asked for) the verification is the compile-only path's compiler runs
(`harness.builds.compile_only`); ahead, the same runs are made for the same units and target, and the
verification finds their results in the compile-only cache.

The compilers run at a lower CPU priority (`AHEAD_NICE`) than the verification beside them, at most
`jobs` candidates at a time (`default_jobs`: what the cores and memory hold), and `stop` kills every
one still running (an eval that ends early leaves no compiler behind).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kb_mcp.harness.builds.builds import BuildService
from kb_mcp.harness.builds.compile_only import CompileOnly
from kb_mcp.harness.builds.toolchain import DEFAULT_ARCH, arch_flag, build_target
from kb_mcp.harness.candidate import SourceUnit, inline_units_ahead, static_units
from kb_mcp.harness.judgment.options import VerifyOptions
from kb_mcp.harness.protocol import WorkerInfo
from kb_mcp.harness.sandbox.running import Running, Stopped
from kb_mcp.harness.sandbox.sandbox import Sandbox

__all__ = ["AHEAD_NICE", "AheadOutcome", "AheadTarget", "BuildsAhead", "default_jobs", "target_for"]

AHEAD_NICE = 10  # builds ahead yield the CPU to the verification (its host thread launches the timed kernels)
BUILD_GIB = 4  # memory one build may take: the host compiler and nvcc over torch's headers, at once
KEPT_CORES = 2  # for the verifying worker and the server


class AheadTarget(BaseModel):
    """What the verifications will build for: compile-only (and its target arch), or the GPU arch and
    torch version the pool's worker reported."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compile_only: bool
    arch: str
    torch_version: str = ""


def target_for(info: WorkerInfo | None, options: VerifyOptions, no_cuda: bool = False) -> AheadTarget:
    """The pool's own rule (`WorkerPool.verify`): compile-only when asked, or where the worker has no
    CUDA, for the options' arch (`CompileOnly.verify`); else the worker's GPU and torch."""
    if no_cuda or options.compile_only or info is None or not info.cuda:
        return AheadTarget(compile_only=True, arch=build_target(arch_flag(options.arch or DEFAULT_ARCH)))
    return AheadTarget(compile_only=False, arch=info.arch or DEFAULT_ARCH, torch_version=info.torch_version)


class AheadOutcome(BaseModel):
    """What one candidate's builds ahead came to (counts for progress; never part of a verdict)."""

    model_config = ConfigDict(extra="forbid")

    units: int = 0
    built: int = 0  # built (or compiled) now
    cached: int = 0  # found in the cache already
    failed: int = 0  # did not build: the verification will build it again and say why
    seconds: float = 0.0
    stopped: bool = False


def default_jobs(cpus: int | None = None, ram_bytes: int | None = None) -> int:
    """How many candidates to build ahead at once: a load_inline build may run its host compiler
    and nvcc together (two processes), `KEPT_CORES` cores stay with the verification and the server,
    and each build may take `BUILD_GIB` of memory. At least one."""
    cpus = cpus or os.cpu_count() or 1
    if ram_bytes is None:
        try:
            ram_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):  # pragma: no cover - every Linux has both
            ram_bytes = 16 << 30
    return max(1, min((cpus - KEPT_CORES) // 2, ram_bytes // (BUILD_GIB << 30)))


class BuildsAhead:
    """Builds candidates ahead of their verification, into the pool's cache (see the module docstring).

    Thread-safe: several threads may build different candidates at once.
    """

    def __init__(self, cache_dir: Path, sandbox: Sandbox, target: AheadTarget, timeout_s: float = 600.0) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.running = Running(nice=AHEAD_NICE)
        self.service = BuildService(cache_dir, sandbox, self.running)
        self.compiler = CompileOnly(cache_dir, sandbox, self.running)

    def units(self, source: str) -> list[SourceUnit]:
        """What would be built ahead for `source`: in compile-only mode every statically read unit
        (what `CompileOnly.verify` compiles), else the certain `load_inline` calls."""
        return static_units(source) if self.target.compile_only else inline_units_ahead(source)

    def build(self, source: str) -> AheadOutcome:
        """Builds `source`'s units (those not in the cache yet); never raises for the candidate."""
        t0 = time.monotonic()
        units = self.units(source)
        outcome = AheadOutcome(units=len(units))
        try:
            if self.target.compile_only and units:
                result = self.compiler.compile(units, self.target.arch, self.timeout_s)
                for u in result.units:
                    outcome.cached += u.ok and u.cached
                    outcome.built += u.ok and not u.cached
                    outcome.failed += not u.ok
                if not result.units:  # no compiler here: nothing was built, nothing to find
                    outcome.failed = len(units)
            elif units:
                for unit in units:
                    reply = self.service.build(unit, self.target.arch, self.target.torch_version, self.timeout_s)
                    outcome.cached += reply.ok and reply.cached
                    outcome.built += reply.ok and not reply.cached
                    outcome.failed += not reply.ok
        except Stopped:
            pass
        outcome.stopped = self.running.stopped
        outcome.seconds = round(time.monotonic() - t0, 3)
        return outcome

    def stop(self) -> None:
        """Kills the compilers still running and starts no more (the eval ended)."""
        self.running.stop()
