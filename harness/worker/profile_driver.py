"""The process that `profile_kernel` runs (under `ncu`, or alone for the timing fallback).

It loads a KernelBench problem and, optionally, a candidate (`ModelNew`), builds the model and
its inputs, warms up *outside* any NVTX range (so compiles, autotuning, lazy init and caches
settle where the profiler does not look), then runs exactly one forward inside the NVTX range
`kbmcp`, which `ncu --nvtx --nvtx-include kbmcp/` restricts itself to.

In `timeline` mode (no counters: ncu absent or blocked) the one forward runs under
torch.profiler instead, and the Chrome trace it writes gives per-kernel timings and launch
shapes (`kernels_from_trace`).

In standby mode the driver is started ahead of the request (under ncu, by
`profiling.profile_standby`): it imports torch and creates its CUDA context, then waits for its
spec to appear in a rendezvous folder. Starting Python and torch is most of a fresh profile's
wall time, and that way it is paid while the agent is thinking rather than while it waits.

Usage: python -m kb_mcp.harness.worker.profile_driver SPEC.json  (writes the DriverReport to spec.report_path)
       python -m kb_mcp.harness.worker.profile_driver --standby DIR [--owner PID] [--idle-s S]

It runs inside the sandbox (`harness.sandbox`, role `driver`), writing only into its scratch
folder. A `load_inline` candidate's extension comes from the shared cache of published builds
(read-only); one not there is built in the driver's scratch, for this run only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from kb_mcp.harness.builds.toolchain import truncate
from kb_mcp.harness.protocol import (
    CLAIMED_FILE,
    EXIT_BAD_SPEC,
    EXIT_NO_GPU,
    EXIT_OK,
    EXIT_UNCLAIMED,
    EXIT_USER_CODE,
    NVTX_RANGE,
    READY_FILE,
    SPEC_FILE,
    DriverReport,
    DriverSpec,
)
from kb_mcp.kb.owners import process_alive

POLL_S = 0.005  # how often a standby driver looks for its spec (a stat call: cheap)


def _fail(spec: DriverSpec, stage: str, exc: BaseException | str, code: int, **info: Any) -> int:
    if isinstance(exc, BaseException):
        tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
        message = f"{type(exc).__name__}: {exc}\n{tail}"
    else:
        message = exc
    # head and tail: the exception line (what failed) and the traceback (where)
    report = DriverReport(ok=False, stage=stage, error=truncate(message, 4000), **info)
    Path(spec.report_path).write_text(report.model_dump_json())
    return code


class _Clock:
    """Wall time per phase, in the order the phases ran."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self.mark = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(now - self.mark, 4)
        self.mark = now


def prepare(clock: _Clock) -> dict[str, Any] | None:
    """Imports torch and creates the CUDA context; the device info, or None without a GPU."""
    import torch

    import kb_mcp.harness.worker.loading  # noqa: F401 - imported here so that its cost lands in this phase

    clock.lap("import_torch")
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    torch.zeros(1, device="cuda")  # creates the context, so its cost shows as its own phase
    clock.lap("cuda_init")
    return {"device": torch.cuda.get_device_name(), "arch": f"sm_{major}{minor}", "torch_version": torch.__version__}


def run(spec: DriverSpec, clock: _Clock | None = None, device: dict[str, Any] | None = None) -> int:
    """Loads, warms up and runs the forward once as the spec says; writes the DriverReport.

    `clock` and `device` come from a standby driver that ran `prepare` before the spec arrived.
    """
    if clock is None:
        clock = _Clock()
        device = prepare(clock)
    import torch

    from kb_mcp.harness.worker.loading import load_module

    phases, lap = clock.phases, clock.lap
    if device is not None and spec.cache_dir:
        from kb_mcp.harness.worker.compile import Builders

        Builders(Path(spec.cache_dir), device["arch"], local_dir=Path(spec.workdir) / "extensions").install()
    info: dict[str, Any] = dict(device or {"torch_version": torch.__version__}, phases_s=phases)
    # Autotuning inside the profiled forward would profile the tuner, not the model.
    torch.backends.cudnn.benchmark = False
    workdir = Path(spec.workdir)
    torch.manual_seed(spec.seed)
    # The problem first, GPU or not: a problem that does not import is the problem's error wherever
    # it runs, and is never taken for a missing GPU or blamed on the candidate.
    try:
        problem = load_module(spec.problem_source, spec.problem_module, workdir)
    except BaseException as exc:  # noqa: BLE001 - user code: any failure is reported, not raised
        return _fail(spec, "load_problem", exc, EXIT_USER_CODE, **info)
    if device is None:
        return _fail(spec, "device", "no CUDA device is visible to the profiling driver", EXIT_NO_GPU, **info)
    model_cls = problem.Model
    if spec.candidate_source is not None:
        try:
            candidate = load_module(spec.candidate_source, spec.candidate_module or "kbmcp_candidate", workdir)
            model_cls = candidate.ModelNew
        except BaseException as exc:  # noqa: BLE001 - user code: any failure is reported, not raised
            return _fail(spec, "load_candidate", exc, EXIT_USER_CODE, **info)
    try:
        init_inputs = problem.get_init_inputs()
    except BaseException as exc:  # noqa: BLE001 - user code: any failure is reported, not raised
        return _fail(spec, "init_inputs", exc, EXIT_USER_CODE, **info)
    try:
        model = model_cls(*init_inputs)
        if isinstance(model, torch.nn.Module):
            model = model.cuda().eval()
    except BaseException as exc:  # noqa: BLE001 - user code: any failure is reported, not raised
        return _fail(spec, "build", exc, EXIT_USER_CODE, **info)
    try:
        # Made on the GPU: building large random inputs on the CPU and copying them costs seconds.
        with torch.device("cuda"):
            inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in problem.get_inputs()]
    except BaseException as exc:  # noqa: BLE001 - user code: any failure is reported, not raised
        return _fail(spec, "inputs", exc, EXIT_USER_CODE, **info)
    lap("load_and_build")

    with torch.no_grad():
        try:
            start = time.perf_counter()
            for _ in range(max(spec.warmup, 1)):  # at least one: lazy compiles must not land in the range
                model(*inputs)
            torch.cuda.synchronize()
            info["warmup_s"] = time.perf_counter() - start
            lap("warmup")
        except BaseException as exc:  # noqa: BLE001 - user code: any failure is reported, not raised
            return _fail(spec, "warmup", exc, EXIT_USER_CODE, **info)
        try:
            _profiled_forward(spec, model, inputs, workdir, info)
        except BaseException as exc:  # noqa: BLE001 - user code: any failure is reported, not raised
            return _fail(spec, "forward", exc, EXIT_USER_CODE, **info)
    lap("forward")
    Path(spec.report_path).write_text(DriverReport(ok=True, **info).model_dump_json())
    return EXIT_OK


def _profiled_forward(spec: DriverSpec, model: Any, inputs: list[Any], workdir: Path, info: dict[str, Any]) -> None:
    """One forward inside the NVTX range ncu profiles, or under torch.profiler (`timeline` mode);
    its time (and the trace's path) go into `info`."""
    import torch

    start = time.perf_counter()
    if spec.mode == "timeline":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            model(*inputs)
            torch.cuda.synchronize()
        info["forward_s"] = time.perf_counter() - start
        trace_path = spec.trace_path or str(workdir / "trace.json")
        prof.export_chrome_trace(trace_path)
        info["trace_path"] = trace_path
    else:
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(NVTX_RANGE)
        model(*inputs)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        info["forward_s"] = time.perf_counter() - start


def wait_for_spec(rendezvous: Path, owner: int | None, idle_s: float) -> DriverSpec | None:
    """Blocks until the profiler hands over a spec (claimed, then returned), or None when the
    owner process is gone or nobody asked within `idle_s` seconds."""
    spec_path, claimed = rendezvous / SPEC_FILE, rendezvous / CLAIMED_FILE
    deadline = time.monotonic() + idle_s
    next_owner_check = 0.0
    while True:
        try:
            os.replace(spec_path, claimed)  # atomic: either the spec is ours, or it was never written
            return DriverSpec.model_validate_json(claimed.read_text())
        except FileNotFoundError:
            pass
        now = time.monotonic()
        if now >= deadline:
            return None
        if owner is not None and now >= next_owner_check:
            if not process_alive(owner):
                return None
            next_owner_check = now + 1.0
        time.sleep(POLL_S)


def standby(rendezvous: Path, owner: int | None, idle_s: float) -> int:
    """Prepares torch and CUDA, then runs the first spec that arrives (see module docstring)."""
    clock = _Clock()
    device = prepare(clock)
    import torch.utils.cpp_extension  # noqa: F401 - load_inline candidates import it: paid while waiting

    (rendezvous / READY_FILE).write_text(json.dumps(clock.phases))
    spec = wait_for_spec(rendezvous, owner, idle_s)
    if spec is None:
        return EXIT_UNCLAIMED
    clock.lap("standby_wait")  # not part of the request's time
    return run(spec, clock, device)


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the spec file named on the command line, or waits for one (--standby)."""
    parser = argparse.ArgumentParser(prog="python -m kb_mcp.harness.worker.profile_driver")
    parser.add_argument("spec", nargs="?", help="the DriverSpec JSON file to run")
    parser.add_argument("--standby", metavar="DIR", help="wait for DIR/spec.json instead")
    parser.add_argument("--owner", type=int, default=None,
                        help="exit when this process is gone (unconfined; a sandboxed driver dies with its sandbox)")
    parser.add_argument("--idle-s", type=float, default=600.0, help="exit when no spec came within this time")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.standby:
        return standby(Path(args.standby), args.owner, args.idle_s)
    if not args.spec:
        parser.print_usage(sys.stderr)
        return EXIT_BAD_SPEC
    try:
        spec = DriverSpec.model_validate(json.loads(Path(args.spec).read_text()))
    except (OSError, ValueError) as exc:
        print(f"profile driver: bad spec {args.spec}: {exc}", file=sys.stderr)
        return EXIT_BAD_SPEC
    return run(spec)


if __name__ == "__main__":
    # A normal exit (not os._exit): ncu's injection finishes its report in the process's exit handlers.
    sys.exit(main())
