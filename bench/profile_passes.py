"""Where ncu's replay passes come from: one kernel profiled with each part of profile_kernel's
ncu configuration alone (GPU).

    source .whl/prelude.sh && python3 bench/profile_passes.py [--out DIR]

Every pass replays the kernel (about 90 ms each for a small kernel on an H100, docs/benchmarks.md),
so the pass count is the per-kernel cost of a profile. For the fused one-kernel candidate of
`tests/profiling/problems/relu_mul_add.py` it runs ncu (restricted to the NVTX range, as
profile_kernel does) with: the whole configuration; the sections alone; the explicit metrics alone;
each section alone; `--set basic`; `--set full`. It prints passes and wall time for each.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "tests" / "profiling" / "problems" / "relu_mul_add.py"
CANDIDATE = ROOT / "tests" / "profiling" / "problems" / "relu_mul_add_fused.py"
PASSES = re.compile(r"-\s*(\d+)\s+pass(?:es)?")


def _spec(work: Path) -> Path:
    from kb_mcp.harness.problem import candidate_id, load_problem
    from kb_mcp.harness.worker.profile_driver import DriverSpec

    problem = load_problem(str(PROBLEM))
    cand = CANDIDATE.read_text()
    spec = DriverSpec(problem_source=problem.source, problem_module=f"kbmcp_problem_{problem.hash}",
                      candidate_source=cand, candidate_module=f"kbmcp_{candidate_id(problem, cand)}",
                      workdir=str(work / "src"), report_path=str(work / "driver.json"))
    path = work / "spec.json"
    path.write_text(spec.model_dump_json())
    return path


def _run(ncu: str, options: list[str], target: list[str], work: Path) -> dict:
    cmd = [ncu, "--nvtx", "--nvtx-include", "kbmcp/", *options, "-o", str(work / "r"), "-f", *target]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    wall = time.perf_counter() - start
    passes = [int(m.group(1)) for m in PASSES.finditer(proc.stdout + proc.stderr)]
    return {"passes": max(passes) if passes else None, "wall_s": round(wall, 2), "rc": proc.returncode,
            "tail": (proc.stdout + proc.stderr)[-300:] if proc.returncode else ""}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = parser.parse_args()
    from kb_mcp.profiling import ncu_parse, profiler

    ncu = profiler.find_ncu()
    if ncu is None:
        print("no ncu on this machine", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="kbmcp-passes-"))
    target = [sys.executable, "-m", "kb_mcp.harness.worker.profile_driver", str(_spec(work))]
    sections = [a for s in profiler.SECTIONS for a in ("--section", s)]
    wanted = ncu_parse.requested_metrics()
    stalls = [ncu_parse.STALL_METRIC.format(r) for r in ncu_parse.STALL_REASONS]
    metrics = ["--metrics", ",".join(wanted)]
    configs = {
        "profile_kernel (sections + metrics)": sections + metrics,
        "sections only": sections,
        "explicit metrics only": metrics,
        "explicit metrics, no stall ratios": ["--metrics", ",".join(m for m in wanted if m not in stalls)],
        "stall ratios only": ["--metrics", ",".join(stalls)],
        **{f"section {s}": ["--section", s] for s in profiler.SECTIONS},
        "--set basic": ["--set", "basic"],
        "--set full": ["--set", "full"],
    }
    subprocess.run(target, capture_output=True)  # builds the candidate once, outside the figures
    rows = {}
    for label, options in configs.items():
        rows[label] = _run(ncu, options, target, work)
        print(f"{label:48s} passes {rows[label]['passes']!s:>4}  wall {rows[label]['wall_s']:6.2f} s"
              + (f"  rc {rows[label]['rc']}: {rows[label]['tail']}" if rows[label]["rc"] else ""), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "profile_passes.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
