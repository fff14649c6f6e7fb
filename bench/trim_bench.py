"""Trimming a client's candidates (`tools.candidate_store.trim`) where one problem holds many verdicts:
the time it holds the KB lock, on this tree and, side by side, on another checkout of kb-mcp.

    python bench/trim_bench.py                              # 10,000 verdicts of one problem
    python bench/trim_bench.py --tree /tmp/before           # and another checkout, runs alternating
    git archive <commit> | tar -x -C /tmp/before            # one way to make that checkout

Builds a KB file whose one problem holds --verdicts valid GPU verdicts (`faster`, checked with the
default options) of other clients, and --keep of the client's own (slower ones: none is what a
composition takes). Then, as `compile_and_verify` does after each verification, each round stores one
more verdict of the client's in that problem and times `trim` (which decides, under the KB lock, which
of the client's candidates the KB needs, asking of each whether a composition takes it). Reported: the
first trim of a process that just loaded the KB, and the median of the rest (a running server).

Each tree runs in processes of its own (its folders linked as `kb_mcp.*` on PYTHONPATH), on a fresh copy
of the same KB file, trees alternating round by round to spread the machine's drifting load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PACKAGES = ("kb", "tools", "harness", "profiling", "decomposition", "policy", "campaign", "clients", "server")
PROBLEM_HASH = "h_bench"


def build_kb(path: Path, verdicts: int, own: int) -> None:
    """Writes the KB file: `verdicts` faster verdicts of other clients in one problem, `own` of alice's."""
    from kb_mcp.kb.models import CandidateRecord, Verdict
    from kb_mcp.kb.ops import PutRecord
    from kb_mcp.kb.store import AtomicJSONStorage, new_meta
    from kb_mcp.kb.tables import Tables

    rng = random.Random(0)
    t = Tables()
    t.meta = new_meta()
    for i in range(verdicts + own):
        mine = i >= verdicts
        rec = CandidateRecord(candidate_id=f"c_{'alice' if mine else 'other'}_{i}", problem="bench",
                              problem_hash=PROBLEM_HASH, verdict=Verdict.faster, arch="sm_90",
                              device="NVIDIA H100 80GB HBM3", time_ms=1.0, eager_ms=2.0,
                              speedup_vs_baseline=1.01 if mine else 1.1 + rng.random(),
                              verified_by=["alice" if mine else f"client_{i % 50}"])
        t.apply(PutRecord("candidates", rec.key, rec.model_dump(mode="json")))
    AtomicJSONStorage(path).write(t.to_tinydb())


def measure(path: Path, rounds: int, keep: int) -> dict[str, Any]:
    """In this process: `rounds` of (store one more of alice's verdicts, time trim); milliseconds."""
    from kb_mcp.kb.models import CandidateRecord, Verdict
    from kb_mcp.kb.store import KBStore
    from kb_mcp.tools import candidate_store

    store = KBStore.open(path)
    folder = path.parent / "candidates"
    folder.mkdir(exist_ok=True)
    times, removed = [], 0
    for r in range(rounds):
        rec = CandidateRecord(candidate_id=f"c_round_{r}", problem="bench", problem_hash=PROBLEM_HASH,
                              verdict=Verdict.faster, arch="sm_90", device="NVIDIA H100 80GB HBM3", time_ms=1.0,
                              eager_ms=2.0, speedup_vs_baseline=1.01, verified_by=["alice"])
        with store.transaction() as tx:
            tx.put_candidate(rec)
        t0 = time.perf_counter()
        removed += len(candidate_store.trim(store, folder, "alice", keep))
        times.append((time.perf_counter() - t0) * 1000)
    return {"code": candidate_store.__file__, "first_ms": times[0], "median_ms": statistics.median(times[1:]),
            "removed": removed}


def linked(tree: Path, into: Path) -> Path:
    """A folder whose `kb_mcp/<package>` links point at `tree`'s folders: that tree imported as kb-mcp."""
    pkg = into / "kb_mcp"
    pkg.mkdir(parents=True)
    for name in PACKAGES:
        (pkg / name).symlink_to(tree.resolve() / name)
    return into


def run_child(kb_file: Path, path_dir: Path | None, rounds: int, keep: int) -> dict[str, Any]:
    """`measure` in a process of its own, on a fresh copy of `kb_file`, importing the tree at `path_dir`
    (None: this one, as installed)."""
    work = Path(tempfile.mkdtemp(prefix="trim-bench-run-"))
    try:
        shutil.copy(kb_file, work / "kb.json")
        env = dict(os.environ)
        if path_dir is not None:
            env["PYTHONPATH"] = str(path_dir)
        cmd = [sys.executable, __file__, "--measure", str(work / "kb.json"), "--rounds", str(rounds),
               "--keep", str(keep)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=1800)
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verdicts", type=int, default=10_000, help="other clients' verdicts of the one problem")
    ap.add_argument("--keep", type=int, default=200, help="alice's bound (KB_MCP_CANDIDATES_KEPT_PER_CLIENT)")
    ap.add_argument("--rounds", type=int, default=30, help="verdicts stored and trims timed per process")
    ap.add_argument("--runs", type=int, default=3, help="processes per tree")
    ap.add_argument("--tree", type=Path, help="another checkout of kb-mcp, run side by side with this one")
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child's side
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.rounds, args.keep)))
        return 0
    top = Path(tempfile.mkdtemp(prefix="trim-bench-"))
    try:
        kb_file = top / "kb.json"
        build_kb(kb_file, args.verdicts, args.keep)
        trees: list[tuple[str, Path | None]] = [("this tree", None)]
        if args.tree:
            trees.insert(0, (str(args.tree), linked(args.tree, top / "other")))
        print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; {args.verdicts:,} verdicts of one "
              f"problem, a bound of {args.keep}, {args.rounds} trims per process", flush=True)
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
        for run in range(args.runs):
            for name, path_dir in trees if run % 2 == 0 else trees[::-1]:
                got = run_child(kb_file, path_dir, args.rounds, args.keep)
                rows[name].append(got)
                print(f"run {run + 1}, {name} ({got['code']}): first trim {got['first_ms']:.1f} ms, then median "
                      f"{got['median_ms']:.2f} ms ({got['removed']} candidates removed)", flush=True)
        for name, runs in rows.items():
            first = statistics.median(float(g["first_ms"]) for g in runs)
            warm = statistics.median(float(g["median_ms"]) for g in runs)
            print(f"{name}: first trim {first:.1f} ms, then {warm:.2f} ms (medians of {len(runs)} processes)")
    finally:
        shutil.rmtree(top, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
