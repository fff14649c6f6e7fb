"""Does timing a candidate interleaved with its reference change the candidate's own time? (GPU)

    source .whl/prelude.sh && python3 bench/interleave_probe.py [--out probe.json]

In one process, with the harness's `Timer` (L2 flush, events, paused collector), for a GPU-bound
problem (`swish`, 8192² fp32) and a launch-bound one (`elementwise_chain_small`, 40 launches), it
times the NVRTC candidate alone, then interleaved run by run with the eager reference, twice over
(alone, interleaved, alone, interleaved), and prints the medians side by side. The harness
interleaves where a reference's time drifts with the host (launch-bound problems); this shows what
interleaving costs where it does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "swish (GPU-bound)": ("examples/problems/swish.py", "examples/candidates/swish_nvrtc.py"),
    "chain (launch-bound)": ("examples/problems/elementwise_chain_small.py",
                             "examples/candidates/elementwise_chain_small_nvrtc.py"),
}
RUNS = 60


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import torch

    from kb_mcp.harness.worker.compile import Builders
    from kb_mcp.harness.worker.integrity_runtime import TrustedSnapshot
    from kb_mcp.harness.worker.loading import load_module
    from kb_mcp.harness.worker.timing import L2Flusher, Series, Timer

    props = torch.cuda.get_device_properties(0)
    cache = Path(tempfile.mkdtemp(prefix="kbmcp-interleave-"))
    Builders(cache, f"sm_{props.major}{props.minor}").install()
    timer = Timer(TrustedSnapshot.capture().trusted, L2Flusher(int(props.L2_cache_size)))
    rows: dict[str, dict[str, Any]] = {}
    for n, (label, (problem_path, cand_path)) in enumerate(CASES.items()):
        problem = load_module((ROOT / problem_path).read_text(), f"ip_problem_{n}", cache)
        cand_mod = load_module((ROOT / cand_path).read_text(), f"ip_cand_{n}", cache)
        init = problem.get_init_inputs()
        ref = problem.Model(*init).cuda().eval()
        cand = cand_mod.ModelNew(*init).cuda().eval()

        def make(i: int, problem: Any = problem) -> list[Any]:
            torch.manual_seed(1000 + i)
            with torch.device("cuda"):
                return list(problem.get_inputs())

        row: dict[str, Any] = {}
        with torch.no_grad():
            for rep in (1, 2):
                alone = timer.series(cand, make, RUNS, 3)
                c, e = timer.interleaved(Series(cand, make, RUNS, 3), Series(ref, make, RUNS, 3))
                row[f"alone #{rep}"] = round(alone.median_ms * 1000, 1)
                row[f"interleaved #{rep}"] = round(c.median_ms * 1000, 1)
                row[f"eager beside #{rep}"] = round(e.median_ms * 1000, 1)
        rows[label] = row
        print(f"{label:22s} " + "  ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
