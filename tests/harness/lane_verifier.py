"""A process that verifies a candidate through the harness's own entry point (`WorkerPool.verify`,
no tool and no server around it), for the tests of two such processes on one GPU.

    python lane_verifier.py PROBLEM CANDIDATE TAG [--times N]

Each verification gets the candidate with its kernel text tagged (`// TAG i`): a new candidate,
built anew. stdout gets one JSON line per result; stderr the lane's INFO log.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys


def main() -> None:
    """Verifies as the arguments say."""
    parser = argparse.ArgumentParser()
    parser.add_argument("problem")
    parser.add_argument("candidate")
    parser.add_argument("tag")
    parser.add_argument("--times", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    from kb_mcp.harness.pool.pool import WorkerPool
    from kb_mcp.harness.problem import load_problem

    problem = load_problem(args.problem)
    with open(args.candidate) as f:
        source = f.read()
    with WorkerPool() as pool:
        for i in range(args.times):
            tagged = source.replace('KERNEL = r"""\n', f'KERNEL = r"""\n// {args.tag} {i}\n', 1)
            result = pool.verify(problem, tagged)
            timings = result.timings
            print(json.dumps({
                "verdict": result.verdict.value, "summary": result.summary, "device": result.device,
                "torch_version": result.torch_version, "problem_hash": result.problem_hash,
                "baseline_cached": timings.baseline_cached if timings else None,
                "baseline_not_cached": timings.baseline_not_cached if timings else None,
                "lane": result.lane.model_dump() if result.lane else None, "phases_s": result.phases_s,
            }), flush=True)


if __name__ == "__main__":
    main()
