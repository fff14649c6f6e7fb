"""The build service (server side): `load_inline` extensions built in a sandbox, published read-only.

A worker whose candidate calls `load_inline` with sources not in the shared cache asks the pool
(`protocol.BuildAsk`). The server checks the flags and includes against the allow-lists
(`allow_lists.flag_refusals`), runs `python -m kb_mcp.harness.worker.build` in a sandbox of its own
(its own scratch folder; it compiles and links but imports nothing, so no candidate code runs
there), and copies the one `.so` it made into `<cache>/torch_extensions/<ext>/<ext>.so`, named by
the content hash the server computes itself. Every sandbox sees that folder read-only: a candidate
cannot plant or alter a build that another candidate (or the census worker, or the profiling
driver) will load. Concurrent builds of one extension by several servers wait on a file lock.

`toolchain(sandbox)` probes, once per process, the compilers as the sandbox sees them
(`toolchain.ToolchainInfo`), for the include allow-list and the compile-only command lines.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import threading
import time
from pathlib import Path

from filelock import FileLock

from kb_mcp.harness.builds.allow_lists import flag_refusals, tried_outside
from kb_mcp.harness.builds.toolchain import (
    ToolchainInfo,
    build_target,
    extension_name,
    light_variants,
    truncate,
)
from kb_mcp.harness.candidate import SourceUnit
from kb_mcp.harness.protocol import BuildReply, BuildReport, BuildSpec
from kb_mcp.harness.sandbox.attempts import Attempt, record, redact
from kb_mcp.harness.sandbox.running import Running, Stopped
from kb_mcp.harness.sandbox.sandbox import Grant, Sandbox
from kb_mcp.harness.sandbox.scratch import new_scratch
from kb_mcp.kb.atomic import temp_beside

REPORT_LIMIT = 4 << 20  # a build report is small; a larger file is not the build process's
_STOPPED = "the build was stopped before it finished (the work it was for was cancelled); nothing was published"


class ToolchainError(RuntimeError):
    """The toolchain could not be probed inside the sandbox (the message has its output)."""


_PROBED: dict[tuple[str, str], ToolchainInfo] = {}
_PROBE_LOCK = threading.Lock()


def toolchain(sandbox: Sandbox) -> ToolchainInfo:
    """The compilers and torch's build settings as seen inside the sandbox (probed once per process)."""
    key = (sandbox.mode, sys.executable)
    with _PROBE_LOCK:
        if key not in _PROBED:
            scratch = new_scratch("probe")
            try:
                code, out = sandbox.run([sys.executable, "-m", "kb_mcp.harness.worker.build", "--probe"],
                                        Grant(role="tool", scratch=scratch), timeout_s=300)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            line = next((x for x in reversed(out.strip().splitlines()) if x.startswith("{")), "")
            if code != 0 or not line:
                raise ToolchainError(
                    f"probing the compilers in the sandbox failed (exit {code}): {out.strip()[-1500:]}")
            _PROBED[key] = ToolchainInfo.model_validate_json(line)
        return _PROBED[key]


def refused_attempts(unit: SourceUnit, tc: ToolchainInfo, role: str) -> None:
    """Records what of the unit's refused flags and includes would have reached outside its build
    (`allow_lists.tried_outside`) as attempts of the work asking for it (`attempts.record`)."""
    tried = tried_outside(unit, tc.include_roots)
    if tried:  # one attempt per unit: a finding names a few attempts, each unit's whole request
        record(Attempt(kind="build", what=redact(f"{unit.name}: {'; '.join(tried)}", 600), role=role))


def _copy_regular(src: Path, dest_dir: Path, name: str) -> None:
    """Copies `src` (a regular file, never a link: the sandbox made it) to `dest_dir/name` atomically."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{src} is not a regular file")
        dest_dir.mkdir(parents=True, exist_ok=True)
        tmp = temp_beside(dest_dir / name)  # one per writer: two workers may publish one build at once
        with os.fdopen(os.dup(fd), "rb") as f_in, open(tmp, "xb") as f_out:
            shutil.copyfileobj(f_in, f_out)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest_dir / name)
    finally:
        os.close(fd)


class BuildService:
    """Builds `load_inline` units for workers, in the sandbox, into the shared cache.

    `running` holds the build processes it starts: the pool's service keeps its own; builds ahead
    (`harness.builds.ahead`) use one that a cancelled eval stops, at a lower CPU priority.
    """

    def __init__(self, cache_dir: Path, sandbox: Sandbox, running: Running | None = None) -> None:
        self.ext_dir = cache_dir / "torch_extensions"
        self.sandbox = sandbox
        self.running = running or Running()
        self.builds = 0  # builds run (cache misses), for tests and status

    def published(self, ext: str) -> Path:
        """Where the extension `ext` is (or would be) in the shared cache."""
        return self.ext_dir / ext / f"{ext}.so"

    def build(self, unit: SourceUnit, arch: str, torch_version: str, timeout_s: float = 600.0) -> BuildReply:
        """The unit built for `arch` (the GPU's; built for its arch-specific target,
        `toolchain.build_target`) and published (or found published), or why not. Never raises for
        the unit."""
        t0 = time.monotonic()
        arch = build_target(arch)
        try:
            tc = toolchain(self.sandbox)
        except ToolchainError as exc:
            return BuildReply(ok=False, log=str(exc))
        refusals = flag_refusals(unit, tc.include_roots)
        if refusals:
            refused_attempts(unit, tc, "build")
            return BuildReply(ok=False, refused="; ".join(refusals))
        if torch_version and torch_version != tc.torch_version:
            return BuildReply(ok=False,
                              log=f"the worker runs torch {torch_version}, the build sandbox {tc.torch_version}")
        torch_version = tc.torch_version
        names = [(light, extension_name(unit, light, torch_version, arch)) for light in light_variants(unit)]
        for light, ext in names:
            if self.published(ext).is_file():
                return BuildReply(ok=True, ext=ext, light=light, cached=True)
        self.ext_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.ext_dir / f".{names[-1][1]}.lock")):
            for light, ext in names:  # another server may have built it while this one waited
                if self.published(ext).is_file():
                    return BuildReply(ok=True, ext=ext, light=light, cached=True)
            if self.running.stopped:
                return BuildReply(ok=False, log=_STOPPED)
            reply = self._run(unit, arch, timeout_s, dict(names))
        return reply.model_copy(update={"seconds": round(time.monotonic() - t0, 3)})

    def _run(self, unit: SourceUnit, arch: str, timeout_s: float, expected: dict[bool, str]) -> BuildReply:
        scratch = new_scratch("build")
        try:
            out_dir = scratch / "out"
            out_dir.mkdir()
            spec = BuildSpec(unit=unit, arch=arch, out_dir=str(out_dir), report_path=str(scratch / "report.json"))
            (scratch / "spec.json").write_text(spec.model_dump_json())
            self.builds += 1
            code, output = self.running.run(
                self.sandbox, [sys.executable, "-m", "kb_mcp.harness.worker.build", str(scratch / "spec.json")],
                Grant(role="build", scratch=scratch), timeout_s=timeout_s)
            if self.running.stopped:
                return BuildReply(ok=False, log=_STOPPED)
            report_path = Path(spec.report_path)
            if code == -9 or not report_path.is_file() or report_path.stat().st_size > REPORT_LIMIT:
                why = f"the build was stopped after {timeout_s:.0f} s" if code == -9 else ("the build process ended "
                                                                                           f"({code})")
                return BuildReply(ok=False, log=truncate(f"{why}: {output.strip()[-4000:]}"))
            report = BuildReport.model_validate_json(report_path.read_text())
            if not report.ok:
                return BuildReply(ok=False, ext=report.ext, light=report.light, log=report.log)
            ext = expected.get(report.light)
            so = out_dir / report.ext / f"{report.ext}.so"
            if ext != report.ext or (out_dir / report.ext).is_symlink() or not so.is_file():
                return BuildReply(ok=False, log="the build process reported a library the server did not ask for")
            _copy_regular(so, self.published(ext).parent, f"{ext}.so")
            return BuildReply(ok=True, ext=ext, light=report.light, log=report.log)
        except Stopped:
            return BuildReply(ok=False, log=_STOPPED)
        except (OSError, ValueError) as exc:
            return BuildReply(ok=False, log=f"the build could not be published: {exc}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
