"""Does the KB make agents choose better? A simulated world, the real tools, four rules side by side.

    python bench/learning_sim.py                      # 20 seeds, every regime, plots in out/learning_sim/
    python bench/learning_sim.py --seeds 4 --quick    # a few minutes: fewer rollouts, fewer regimes
    python bench/learning_sim.py --regimes bandit poison --seeds 20 --jobs 2

No GPU: the world is hidden, the measurements are simulated, and everything else is real. The new
rule is our shipped policy: every choice is `tools.suggest_optimizations.run` on a real KB file
(seeded from the shipped seed KB), taking the first suggestion with the tool's defaults; every
outcome is a `CandidateRecord` stored as `compile_and_verify` would store it, credited through
`tools.record_outcome.run`. The old rule is the policy kb-mcp shipped before (softmax over a
utility at temperature 0.3, every sample kept at full weight, credit against any parent the
caller names, lineage-blind exclusions), replayed in memory with its exact arithmetic. Uniform
picks at random; the oracle knows every true effect, including the problem's own. Beside them,
"knows the means" takes the best by its state's true means (not the problem's own deviation), which
it knows from the moment they change: the most any learning rule could reach.

The world (one per seed), over the seed KB's 23 states and their applicable optimizations:

* each (state, optimization) has a hidden true mean log-speedup, heavy-tailed (a Student t with
  3 degrees of freedom: most optimizations do little, a few do a lot, some harm), and a chance of
  failing to compile or verify (mean 25 %);
* each problem deviates from its state's means (sd PROBLEM_SD); each measurement is noisy (sd NOISE_SD);
* states are visited with Zipf-like frequencies; applying an optimization moves the kernel to
  another state with a hidden per-(state, optimization) distribution (multi-step regime);
* the KB's priors are set aligned with the truth, uninformative (all neutral) or misleading (the
  truth's ranking reversed) before the first rollout.

Regimes: `bandit` (single steps on fresh problems, 900 rollouts, three prior kinds), `start` (the
bandit stream with aligned priors, each problem's first kernel 1-4x or 1-10x slower than the
reference, log-uniform, and the step recorded against it; the shipped credit rule beside the one before
it, which counted every parent slower than the reference as the reference: `policy.credit.EAGER_CAP`,
through the same `record_outcome`), `multistep`
(trajectories of several steps per problem, lineage and phase ordering matter), `transfer` (a KB
trained on one problem set, tested on another), `arch` (two GPU families with correlated truths),
`drift` and `drift_shuffle` (the truth changes mid-stream; beside it, the same rule in a world where
the changed truth always held; levels as shares of the oracle's gain and as the gap closed between
uniform and the oracle, the scale on which a level before a change compares with one after it;
the drift target judged against the no-change control, the level the rule reaches in the changed
world: back at 90 % of it within 15 problems of a state, and at 90 % of it over problems +11-15;
beside it, the level before the change and "knows the means"),
`poison` (a client crediting a harmful optimization with ordinary candidates recorded against parents it
verified deliberately slow: 100x, poisoning, or 10x, sandbagging: as slow as the shipped rule counts a
first kernel in full; both credit rules). Every figure is a mean over seeds with a 95 % t-interval.

The code: `learnsim.world` (the hidden truth), `learnsim.rules` (the rules), `learnsim.regimes` and
`learnsim.starts` (the regimes), `learnsim.run` (one seed's runs), `learnsim.report` and `learnsim.plots`
(the tables and figures).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # learnsim/ beside this file, however it is run

from learnsim.report import report
from learnsim.run import Config, run_seed


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, default=20, help="worlds to average over (default 20)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--regimes", nargs="+", default=list(Config.regimes), choices=list(Config.regimes))
    p.add_argument("--rollouts", type=int, default=900)
    p.add_argument("--kinds", nargs="+", default=list(Config.kinds), choices=list(Config.kinds),
                   help="prior kinds of the bandit regime")
    p.add_argument("--quick", action="store_true", help="fewer rollouts and problems (a smoke run, not the figures)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="worker processes (seeds run in parallel)")
    p.add_argument("--out", type=Path, default=Path("out/learning_sim"),
                   help="folder for summary.txt, results.json, plots")
    p.add_argument("--tmp", default="/dev/shm" if Path("/dev/shm").is_dir() else None,
                   help="where the KB files live while running (a RAM disk keeps fsync cheap)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    if args.tmp is not None:  # a folder the caller named but has not made yet is made, as --out is
        Path(args.tmp).mkdir(parents=True, exist_ok=True)
    cfg = Config(rollouts=args.rollouts, kinds=tuple(args.kinds), regimes=tuple(args.regimes), tmp=args.tmp)
    if args.quick:
        cfg = Config(rollouts=min(args.rollouts, 450), kinds=tuple(args.kinds), regimes=tuple(args.regimes),
                     drift_rollouts=600, problems=40, train=150, test=60, tmp=args.tmp)
    started = time.monotonic()
    jobs = [(seed, cfg) for seed in range(args.first_seed, args.first_seed + args.seeds)]
    results: list[dict[str, Any]] = []
    if args.jobs > 1:
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            results.extend(_progress(pool.imap_unordered(run_seed, jobs), len(jobs)))
    else:
        results.extend(_progress(map(run_seed, jobs), len(jobs)))
    results.sort(key=lambda r: r["seed"])
    print(report(results, cfg, args.out, time.monotonic() - started))
    print(f"\nplots and raw results: {args.out}/")
    return 0


def _progress(runs: Any, total: int) -> Any:
    for done, res in enumerate(runs, 1):
        print(f"  seed {res['seed']} done in {res['wall_s']:.0f} s ({done}/{total})", file=sys.stderr, flush=True)
        yield res


if __name__ == "__main__":
    raise SystemExit(main())
