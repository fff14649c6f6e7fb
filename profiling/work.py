"""The work census (server side): what one forward of a candidate does, from hardware counters.

Asked for by the verify worker when a result escalates (`harness.plausibility`): the pool runs
the profiling driver under Nsight Compute with four metrics and no sections (DRAM bytes read and
written, warp instructions executed, duration; one or two replay passes per kernel), in the
sandbox like every profile, and answers with a `WorkCensus`. ncu empties the caches before each
kernel, so the bytes are those of a cold call, as the timer's L2 flush makes every timed call.

Nothing here raises for a candidate or a machine: an unavailable census says why in its note,
and the verdict then names that reason.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from kb_mcp.harness.gpu import lane
from kb_mcp.harness.plausibility import WORK_METRICS, WorkCensus, work_census_from_profiles
from kb_mcp.harness.problem import Problem, candidate_id
from kb_mcp.harness.protocol import DriverReport, DriverSpec
from kb_mcp.harness.sandbox.sandbox import Sandbox
from kb_mcp.harness.sandbox.scratch import new_scratch
from kb_mcp.kb.progress import Progress, no_progress
from kb_mcp.profiling import ncu_parse
from kb_mcp.profiling.ncu_parse import counters_blocked_reason
from kb_mcp.profiling.ncu_run import Spawner, export_pages, find_ncu, ncu_command, run_ncu

__all__ = ["MAX_KERNELS", "take_work_census"]

MAX_KERNELS = 500  # kernel launches profiled at most; beyond, the census (and so the bound) is partial


def take_work_census(problem: Problem, source: str, *, cache_dir: Path, sandbox: Sandbox,
                     timeout_s: float = 120.0, progress: Progress = no_progress) -> WorkCensus:
    """The work census of one forward of `source` (after two warm-up calls), or an unavailable one
    whose note says why (no ncu, counters refused, the run failed or took too long)."""
    start = time.perf_counter()
    ncu = find_ncu()
    if ncu is None:
        return WorkCensus(available=False, note="Nsight Compute (ncu) was not found; install it or set KB_MCP_NCU")
    work = new_scratch("work")
    try:
        with lane.hold(f"work census {problem.name}", progress):  # inside a verification's hold: the same one
            census = _run(ncu, problem, source, work, cache_dir, sandbox, timeout_s, progress)
    except Exception as exc:  # noqa: BLE001 - a failed census is a note, never the server's crash
        census = WorkCensus(available=False, note=f"the profiling run failed: {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    census.wall_s = round(time.perf_counter() - start, 3)
    return census


def _run(ncu: str, problem: Problem, source: str, work: Path, cache_dir: Path, sandbox: Sandbox,
         timeout_s: float, progress: Progress) -> WorkCensus:
    cid = candidate_id(problem, source)
    spec = DriverSpec(
        problem_source=problem.source, problem_module=f"kbmcp_problem_{problem.hash}",
        candidate_source=source, candidate_module=f"kbmcp_{cid}", mode="ncu", warmup=2,
        workdir=str(work / "src"), report_path=str(work / "driver.json"), cache_dir=str(cache_dir),
    )
    spec_path = work / "spec_work.json"
    spec_path.write_text(spec.model_dump_json())
    spawner = Spawner(sandbox, cache_dir, ncu)
    target = [sys.executable, "-m", "kb_mcp.harness.worker.profile_driver", str(spec_path)]
    cmd = ncu_command(ncu, work / "report", target, metrics=WORK_METRICS, max_kernels=MAX_KERNELS, sections=())
    progress(0, None, "counting the candidate's DRAM bytes and instructions under Nsight Compute")
    run = run_ncu(cmd, spawner, work, timeout_s=timeout_s, progress=progress)
    if run.timed_out:
        return WorkCensus(available=False, note=f"the profiling run took longer than {timeout_s:.0f} s")
    blocked = counters_blocked_reason(run.output)
    if blocked is not None:
        return WorkCensus(available=False, note=blocked)
    report_path = Path(spec.report_path)
    if not report_path.is_file() or report_path.is_symlink():
        return WorkCensus(available=False, note=f"the profiling driver left no report (exit {run.returncode}): "
                          f"{run.output.strip()[-300:]}")
    driver = DriverReport.model_validate_json(report_path.read_text())
    if not driver.ok:
        return WorkCensus(available=False, note=f"the candidate failed under the profiler ({driver.stage}): "
                          f"{(driver.error or '')[:300]}")
    made = work / "report.ncu-rep"
    if not made.is_file() or made.is_symlink():
        return WorkCensus(available=False,
                          note=f"ncu wrote no report (exit {run.returncode}): {run.output.strip()[-300:]}")
    raw, _ = export_pages(ncu, made, spawner)
    kernels = ncu_parse.parse_ncu_csv(raw, None)
    if not kernels:
        return WorkCensus(available=False, note="no kernel ran inside the profiled forward")
    note = f"stopped after {MAX_KERNELS} kernel launches: the bound counts those" if len(kernels) >= MAX_KERNELS else ""
    return work_census_from_profiles(kernels, note)
