"""The compile-only path (server side): a candidate checked without a GPU, and without running it.

Nothing of the candidate runs, not even its import: its CUDA sources are read from the syntax
tree (`candidate.static_units`: string literals and module-level constants passed to
`load_inline` or `torch.cuda._compile_kernel`), its flags and `#include`s are checked against the
allow-lists (`allow_lists.flag_refusals`), and the compilers check what is allowed, each run in a
sandbox of its own (`harness.sandbox.sandbox`, role `compiler`): nvcc for the target arch (the GPU's
arch-specific target, `toolchain.build_target`: the default sm_90 is built as sm_90a), and the
host compiler for `load_inline`'s C++ part. Sources built at run time (computed strings) cannot
be read this way; the result says so.

Each compiler run's result is cached under `<cache>/compile_only`, keyed by its source, command
line and toolchain, all computed here: fixing the CUDA part of an extension does not redo the check
of its C++ part. The verdict is `needs_gpu` (it compiles) or `compile_error` with the compilers'
messages, lines pointing into the candidate's strings (`cuda_sources(12)`, `kernel.cu(4)`). A unit
whose compilers failed only on headers this machine lacks (`toolchain.machine_limit`: the CPU build
of torch has no CUDA headers, a toolkit installed without a library's) is not the candidate's
error: it stays `needs_gpu`, with that note (`CompileUnit.limited`).

What nvcc built is disassembled in the same sandbox role (`harness.judgment.precision.Disassembler`,
`cuobjdump -sass`): a kernel computing on the tensor cores in a precision the request's track does
not allow (for the problem's dtypes as its source names them) is not judged here: an error-
compensated scheme (3xTF32) computes on such instructions at float32's accuracy, which only its
numbers show. The result carries the pending check (`VerifyResult.precision`) and the `needs_gpu`
summary says that precision probes on a GPU will judge it. The verdict comes from `verdict.judge`,
as on a GPU.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

from kb_mcp.harness.builds.allow_lists import flag_refusals
from kb_mcp.harness.builds.builds import BuildService, ToolchainError, refused_attempts, toolchain
from kb_mcp.harness.builds.toolchain import (
    DEFAULT_ARCH,
    MESSAGE_LIMIT,
    CompilerRun,
    ToolchainInfo,
    arch_flag,
    build_target,
    compile_runs,
    diagnostics,
    extension_name,
    light_variants,
    machine_limit,
    missing_declarations,
    truncate,
)
from kb_mcp.harness.candidate import INLINE_BUILDERS, NVRTC_BUILDERS, SourceUnit, kernel_names, static_units, style_of
from kb_mcp.harness.judgment.integrity_static import check_source
from kb_mcp.harness.judgment.precision import (
    Disassembler,
    PrecisionEvidence,
    dtypes_named,
    evidence_of,
    precision_check,
)
from kb_mcp.harness.judgment.verdict import CompileResult, CompileUnit, Evidence, VerifyOptions, VerifyResult, judge
from kb_mcp.harness.problem import Problem
from kb_mcp.harness.sandbox.running import Running
from kb_mcp.harness.sandbox.sandbox import Grant, Sandbox, kill_group
from kb_mcp.harness.sandbox.scratch import new_scratch
from kb_mcp.kb import pyparse
from kb_mcp.kb.atomic import write_atomic
from kb_mcp.kb.progress import Progress


def computed_builds(source: str, found: list[SourceUnit]) -> list[int]:
    """Lines of builder calls whose sources could not be read statically (computed at run time)."""
    try:
        tree = pyparse.parse(source)
    except SyntaxError:
        return []
    seen = {u.line for u in found}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in NVRTC_BUILDERS | INLINE_BUILDERS and node.lineno not in seen:
                lines.append(node.lineno)
    return sorted(lines)


def _output_of(run: CompilerRun) -> str:
    """The file an nvcc run writes (`-o NAME`), or "" for runs that build nothing to read."""
    argv = list(run.argv)
    if run.label != "nvcc" or "-o" not in argv[:-1]:
        return ""
    return argv[argv.index("-o") + 1]


class CompileOnly:
    """Statically read sources, compiled in the sandbox; results cached by what was compiled."""

    def __init__(self, cache_dir: Path, sandbox: Sandbox, running: Running | None = None) -> None:
        """`running` holds the compilers it starts (checks ahead of a verification pass one that a
        cancelled eval stops, `harness.builds.ahead`)."""
        self.store = cache_dir / "compile_only"
        self.cache_dir = cache_dir
        self.sandbox = sandbox
        self.running = running or Running()

    def disassembler(self) -> Disassembler:
        """`cuobjdump` as the sandbox sees it (None inside when the toolchain has none)."""
        try:
            tc = toolchain(self.sandbox)
        except ToolchainError:
            return Disassembler(self.cache_dir, self.sandbox, None)
        return Disassembler(self.cache_dir, self.sandbox, tc.cuobjdump, tc.nvdisasm)

    def verify(self, problem: Problem, source: str, options: VerifyOptions, candidate_id: str,
               progress: Progress) -> VerifyResult:
        """The compile-only verdict on `source` (needs_gpu or compile_error; invalid for static findings)."""
        t0 = time.monotonic()
        progress(0, 8, "running static checks")
        findings = check_source(source, options.allow, composed=options.mode == "composed")
        units = static_units(source)
        progress(7, 8, "compiling the candidate's CUDA sources")
        gpu_arch = arch_flag(options.arch or DEFAULT_ARCH)
        comp = self.compile(units, build_target(gpu_arch), options.compile_timeout_s)
        computed = computed_builds(source, units)
        if computed:
            comp = comp.model_copy(update={"messages": comp.messages + [
                f"builder call at line {n} builds sources computed at run time: not compiled here (compile-only "
                "reads the candidate without running it); a GPU machine builds them" for n in computed[:4]]})
        precision = precision_check(evidence_of(comp.units), options.track, dtypes_named(problem.source)) \
            if comp.ok else None
        judgement = judge(Evidence(compile=comp, findings=findings, precision=precision))
        try:
            torch_version = toolchain(self.sandbox).torch_version
        except ToolchainError:
            torch_version = ""
        progress(8, 8, judgement.verdict.value)
        return VerifyResult(
            candidate_id=candidate_id, problem=problem.name, problem_hash=problem.hash, verdict=judgement.verdict,
            summary=judgement.summary, flagged=judgement.flagged, compile=comp, findings=findings, arch=gpu_arch,
            torch_version=torch_version, phase="compile", elapsed_s=round(time.monotonic() - t0, 3),
            track=options.track, precision=precision,
        )

    def precision_of(self, units: list[SourceUnit], arch: str, builds: BuildService,
                     timeout_s: float = 600.0) -> PrecisionEvidence:
        """What the SASS of a candidate's builds on a GPU (`units`, as its worker recorded them)
        computes in: `load_inline` extensions as the build service published them, found under the
        names the server computes itself; NVRTC sources built by nvcc for the same target (this
        path's cache). Every read runs in the sandbox; nothing of the candidate runs."""
        evidence = PrecisionEvidence()
        target = build_target(arch or DEFAULT_ARCH)
        try:
            torch_version = toolchain(self.sandbox).torch_version
        except ToolchainError as exc:
            for u in units:
                evidence.merge(u.name, None, str(exc)[:200])
            return evidence
        disassembler = self.disassembler()
        for u in units:
            if u.kind != "load_inline":
                continue
            names = [extension_name(u, light, torch_version, target) for light in light_variants(u)]
            so = next((builds.published(n) for n in names if builds.published(n).is_file()), None)
            kernels, why = disassembler.precisions(so) if so is not None else (None, "not in the build cache")
            evidence.merge(u.name, kernels, why)
        nvrtc = [u for u in units if u.kind == "nvrtc"]
        for cu in self.compile(nvrtc, target, timeout_s).units if nvrtc else []:
            evidence.merge(cu.name, cu.precisions if cu.ok else None, "" if cu.ok else "nvcc could not build it")
        return evidence

    def compile(self, units: list[SourceUnit], arch: str, timeout_s: float = 600.0) -> CompileResult:
        """Compiles each unit for `arch` (load_inline C++ with the host compiler), light headers first."""
        arch = arch_flag(arch)
        if not units:
            return CompileResult(ok=True, style="none", arch=arch, messages=["no CUDA source found to compile"])
        try:
            tc = toolchain(self.sandbox)
        except ToolchainError as exc:
            return CompileResult(ok=False, style=style_of(units), arch=arch, messages=[str(exc)[:500]])
        if tc.nvcc is None:
            return CompileResult(ok=True, style=style_of(units), arch=arch,
                                 messages=["nvcc not found: the CUDA sources were found but not compiled"])
        t0 = time.perf_counter()
        compiled = [self._unit(u, arch, tc, timeout_s) for u in units]
        messages: list[str] = []
        for u in compiled:
            if not u.ok:
                found = [f"{u.name}: {m}" for m in diagnostics(u.log)]
                messages += found or [f"{u.name}: compilation failed (see log)"]
        if all(u.ok for u in compiled):
            messages += [f"{u.name}: not compiled here: {u.limited}" for u in compiled if u.limited]
            messages += [f"{u.name}: {m}" for u in compiled if not u.limited for m in diagnostics(u.log)]
        return CompileResult(
            ok=all(u.ok for u in compiled), style=style_of(units), arch=arch,
            seconds=round(time.perf_counter() - t0, 3), cached=all(u.cached for u in compiled),
            units=compiled, messages=messages[:MESSAGE_LIMIT],
        )

    def _unit(self, unit: SourceUnit, arch: str, tc: ToolchainInfo, timeout_s: float) -> CompileUnit:
        t0 = time.perf_counter()
        refused = flag_refusals(unit, tc.include_roots)
        if refused:
            # Not compiled at all: the refusal is the diagnostic, and what reached outside an attempt.
            refused_attempts(unit, tc, "compiler")
            return CompileUnit(kind=unit.kind, name=unit.name, ok=False, kernels=kernel_names(unit.cuda_source),
                               log="\n".join(f"error: refused: {r}" for r in refused))
        variants = light_variants(unit) if unit.kind == "load_inline" else [False]
        for light in variants:
            runs = compile_runs(unit, arch, tc, light)
            outs, cached = self._results(runs, tc.ident, timeout_s)
            ok = all(rc == 0 for rc, _, _ in outs)
            if not ok and light and len(variants) > 1 and missing_declarations("\n".join(t for _, t, _ in outs)):
                continue
            # A run that failed only on headers this machine lacks says nothing against the candidate.
            limits = [machine_limit(text, tc.torch_cuda_headers) for rc, text, _ in outs if rc != 0]
            limited = "; ".join(limits) if limits and all(limits) else ""
            read = [sass for _, _, sass in outs if sass is not None]
            precisions = {k: v for sass in read for k, v in sass.items()} if (ok or limited) and read else None
            return CompileUnit(kind=unit.kind, name=unit.name, ok=ok or bool(limited), limited=limited, cached=cached,
                               seconds=round(time.perf_counter() - t0, 3), kernels=kernel_names(unit.cuda_source),
                               log="\n".join(text for _, text, _ in outs if text.strip()), precisions=precisions)
        raise AssertionError("unreachable")  # pragma: no cover

    def _results(self, runs: list[CompilerRun], ident: str,
                 timeout_s: float) -> tuple[list[tuple[int, str, dict[str, list[str]] | None]], bool]:
        """Results of `runs` (return code, log, the SASS precisions of what nvcc built), from the
        cache where present; (results, all cached)."""
        results: dict[int, tuple[int, str, dict[str, list[str]] | None]] = {}
        todo: list[int] = []
        for i, run in enumerate(runs):
            hit = self.store / f"{run.key(ident)}.json"
            try:
                data = json.loads(hit.read_text())
                if int(data["rc"]) == 0 and _output_of(run) and "sass" not in data:
                    raise KeyError("sass")  # cached before the SASS was read: build it again
                results[i] = (int(data["rc"]), str(data["log"]), data.get("sass"))
            except (OSError, ValueError, KeyError):
                todo.append(i)
        if todo:
            self.store.mkdir(parents=True, exist_ok=True)
            for i, (rc, log, sass) in zip(todo, self._run_all([runs[i] for i in todo], timeout_s)):
                results[i] = (rc, truncate(log), sass)
                if rc != -9:  # a killed compiler says nothing about the source: never cache it
                    path = self.store / f"{runs[i].key(ident)}.json"
                    # a temp file per writer: checks ahead (other threads) may write the same entry
                    write_atomic(path, json.dumps({"rc": rc, "log": results[i][1], "sass": sass}))
        return [results[i] for i in range(len(runs))], not todo

    def _run_all(self, runs: list[CompilerRun], timeout_s: float) -> list[tuple[int, str, dict[str, list[str]] | None]]:
        """Runs the compilers concurrently, each in a sandbox (and scratch folder) of its own; what
        nvcc built is disassembled there (`harness.judgment.precision`) before the folder goes."""
        started: list[tuple[Path, subprocess.Popen[str]]] = []
        disassembler = self.disassembler()
        try:
            for run in runs:
                scratch = new_scratch("compile")
                try:
                    (scratch / run.filename).write_text(run.text)
                    proc = self.running.popen(self.sandbox, list(run.argv), Grant(role="compiler", scratch=scratch),
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                except BaseException:
                    shutil.rmtree(scratch, ignore_errors=True)
                    raise
                started.append((scratch, proc))
            deadline = time.monotonic() + timeout_s
            out: list[tuple[int, str, dict[str, list[str]] | None]] = []
            for run, (scratch, proc) in zip(runs, started):
                try:
                    text, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    kill_group(proc)
                    text, _ = proc.communicate()
                    out.append((-9, (text or "") + f"\n[compiler killed after {timeout_s:.0f} s]", None))
                    continue
                built = scratch / _output_of(run) if proc.returncode == 0 and _output_of(run) else None
                sass = disassembler.precisions(built)[0] if built is not None and built.is_file() else None
                out.append((proc.returncode, re.sub(re.escape(str(scratch)) + "/", "", text or ""), sass))
            return out
        finally:
            for scratch, proc in started:
                self.running.release(proc)
                shutil.rmtree(scratch, ignore_errors=True)
