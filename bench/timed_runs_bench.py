"""Timed runs: what one timed run costs beside the call it times, and whether a series that stops
once its median is precise reports the median the longer series reports.

    python bench/timed_runs_bench.py [PROBLEM.py ...] [--kernelbench DIR] [--rounds 3] [--out F]

One process, the harness's own pieces (its `Timer` on trusted functions, the L2 flush, fresh inputs
made on the device from a new seed, `values.compare`), the reference itself as the timed callable,
each timed output re-checked against a second reference call as a candidate's are. Per problem:

  (1) a timed run piece by piece, each the median of 20 repetitions with the device synchronized
      around it: the fresh inputs, the reference's output on them (for the re-check), the timed
      call itself (flush, events, synchronizes), the re-check as the harness makes it (lean where
      the reference is finite) and by the general arithmetic; and what an input set of the checks
      does besides its calls ("set: ..."), for the checks phase;
  (2) rounds of the two ways a series stops, side by side, alternating: `wall` stops at the wall
      budget (`timing.TIMED_WALL_S`) or after its runs (at most `timing.MAX_RUNS`); `precise`
      stops as well once the median's 95 % interval is within `timing.PRECISION` of it. Per round:
      wall time, runs and median of each; the ratio of the walls and of the medians.

Problems: the files named, else the examples `swish` (GPU-bound, 256 MB) and
`elementwise_chain_small` (launch-bound), and with `--kernelbench` a few level-1 and level-2
problems at their real sizes. Without a GPU it runs on the host clock (what CI
exercises, on a small problem).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# a large elementwise problem (the wall budget's case), a mid-sized one, two GEMMs
KERNELBENCH_PICKS = ("level1/19_ReLU.py", "level1/88_MinGPTNewGelu.py", "level1/1_Square_matrix_multiplication_.py",
                     "level2/12_Gemm_Multiply_LeakyReLU.py")
REPS = 20


class Bench:
    """One problem's reference, inputs and timer, as the harness's candidate series sees them."""

    def __init__(self, path: Path, work: Path) -> None:
        import torch

        from kb_mcp.harness.judgment.verdict import VerifyOptions
        from kb_mcp.harness.worker.loading import load_module
        from kb_mcp.harness.worker.timing import L2Flusher, Timer

        self.cuda = torch.cuda.is_available()
        self.device = "cuda" if self.cuda else "cpu"
        self.mod = load_module(path.read_text(), f"timed_runs_{path.stem}", work)
        torch.manual_seed(0)
        with torch.device(self.device):
            init = list(self.mod.get_init_inputs())
            self.ref = self.mod.Model(*init).to(self.device).eval()
        if self.cuda:
            from kb_mcp.harness.worker.integrity_runtime import TrustedSnapshot

            props = torch.cuda.get_device_properties(0)
            self.timer = Timer(TrustedSnapshot.capture().trusted, L2Flusher(int(props.L2_cache_size)))
        else:
            self.timer = Timer.on_host()
        self.timer.calibrate()
        self.options = VerifyOptions()
        self._seed = 1000

    def make(self, i: int = 0) -> list[Any]:
        """Fresh inputs from a new seed, made on the device."""
        import torch

        self._seed += 1
        torch.manual_seed(self._seed)
        with torch.device(self.device):
            xs = list(self.mod.get_inputs())
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in xs]

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()

    def recheck(self, out: Any, ref_out: Any, lean: bool = True) -> str | None:
        """The timed output's re-check, as `TimedChecks._timed_output` makes it (`lean` False: the
        general arithmetic, with its own finiteness test, on the same scale)."""
        import torch

        from kb_mcp.harness.worker import values

        for c, r in zip(values.leaves(out) or [], values.leaves(ref_out) or []):
            atol, rtol, _ = values.tolerance_for(r.dtype, None, None, self.options)
            if lean:
                got = values.compare(c, r, atol, rtol, detail=False)
                if not got.passed:
                    return got.message
                continue
            work = torch.float64 if r.dtype == torch.float64 else torch.float32
            rflat = values.flat(r)
            scale, _ = values._scale(rflat)
            if values._any_mismatch(values.flat(c), rflat, work, atol, rtol, scale, finite_reference=False):
                return "outside the tolerance"
        return None

    def pieces(self) -> dict[str, float]:
        """Milliseconds per piece of one timed run (median of REPS)."""
        import torch

        got: dict[str, list[float]] = {}

        def clock(name: str, fn: Callable[[], Any]) -> Any:
            self.sync()
            t0 = time.perf_counter()
            out = fn()
            self.sync()
            got.setdefault(name, []).append((time.perf_counter() - t0) * 1e3)
            return out

        with torch.no_grad():
            self.ref(*self.make())  # first calls may pick kernels
            for _ in range(REPS):
                xs = clock("fresh inputs", self.make)
                ref_out = clock("reference output", functools.partial(self.ref, *xs))
                out = clock("timed call (flush, events, syncs)", functools.partial(self.timer._one, self.ref, xs))[0]
                clock("re-check, lean where finite (the harness's)", functools.partial(self.recheck, out, ref_out))
                clock("re-check, general arithmetic", functools.partial(self.recheck, out, ref_out, lean=False))
                self._set_pieces(clock, xs, ref_out, out)
                del xs, ref_out, out
        return {k: round(statistics.median(v), 4) for k, v in got.items()}

    def _set_pieces(self, clock: Callable[[str, Callable[[], Any]], Any], xs: list[Any], ref_out: Any,
                    out: Any) -> None:
        """What an input set of the checks does besides the calls (`set_checks.SetChecks`), piece by
        piece: its cached blocks given back first, the candidate's copy of the inputs, the allocator
        poisoned in blocks of the output's size (on a GPU), the full comparison, both outputs'
        digests, and the inputs compared with their pristine copy."""
        import torch

        from kb_mcp.harness.worker import values

        outs = values.leaves(out) or []
        refs = values.leaves(ref_out) or []
        clock("set: cached blocks given back", torch.cuda.empty_cache if self.cuda else lambda: None)
        copies = clock("set: the candidate's copy of the inputs", functools.partial(values.clone_inputs, xs))
        if self.cuda:
            sizes = [t.untyped_storage().nbytes() for t in refs] * 2
            clock("set: allocator poisoned (2 output-sized blocks)", functools.partial(values.poison_allocator, sizes))

        def full() -> None:
            for c, r in zip(outs, refs):
                atol, rtol, _ = values.tolerance_for(r.dtype, None, None, self.options)
                values.compare(c, r, atol, rtol)

        clock("set: the full comparison", full)
        clock("set: both outputs' digests", lambda: [values.digest(t) for t in outs + refs])
        tensors = [(a, b) for a, b in zip(copies, xs) if isinstance(a, torch.Tensor)]
        clock("set: inputs against their pristine copy", lambda: all(values.same(a, b) for a, b in tensors))

    def series(self, precise: bool) -> dict[str, Any]:
        """The candidate's series as `TimedChecks.time_candidate` makes it: wall time, runs, median."""
        import torch

        from kb_mcp.harness.worker.run_stats import PRECISION, median_interval
        from kb_mcp.harness.worker.timing import TIMED_WALL_S

        refs: dict[int, Any] = {}

        def make_with_ref(i: int) -> list[Any]:
            xs = self.make()
            if i >= 0:
                refs[i] = self.ref(*xs)
            return xs

        errors: list[str] = []

        def check(i: int, out: Any) -> str | None:
            err = self.recheck(out, refs.pop(i))
            if err:
                errors.append(err)
            return err

        with torch.no_grad():
            t0 = time.perf_counter()
            runs = self.timer.runs_for(self.ref, self.make, False, None)
            stats = self.timer.series(self.ref, make_with_ref, runs, self.options.warmup_runs, check,
                                      wall_s=TIMED_WALL_S, precision=PRECISION if precise else None)
            wall = time.perf_counter() - t0
        lo, hi = median_interval(stats.gpu_ms)
        return {"wall_s": round(wall, 4), "runs": len(stats.gpu_ms), "median_ms": round(stats.median_ms, 6),
                "interval_ms": [round(lo, 6), round(hi, 6)], "errors": len(errors)}


def measure(path: Path, rounds: int, work: Path) -> dict[str, Any]:
    """Both measurements of one problem."""
    bench = Bench(path, work)
    out: dict[str, Any] = {"problem": path.name, "device": bench.device, "pieces_ms": bench.pieces(), "rounds": []}
    for _ in range(rounds):
        wall, precise = bench.series(precise=False), bench.series(precise=True)
        out["rounds"].append({"wall": wall, "precise": precise,
                              "wall_ratio": round(precise["wall_s"] / wall["wall_s"], 4),
                              "median_ratio": round(precise["median_ms"] / wall["median_ms"], 4)})
    return out


def report(row: dict[str, Any]) -> list[str]:
    """The printed lines of one problem."""
    lines = [f"{row['problem']} ({row['device']})"]
    pieces = row["pieces_ms"]
    call = pieces["timed call (flush, events, syncs)"]
    for name, ms in pieces.items():
        lines.append(f"  {name:<46} {ms:9.3f} ms  {ms / call if call else 0:6.2f}x the timed call")
    for i, r in enumerate(row["rounds"]):
        w, p = r["wall"], r["precise"]
        lines.append(f"  round {i}: wall-stop {w['runs']:3d} runs {w['wall_s']:.3f} s median {w['median_ms']:.4f} ms | "
                     f"precise-stop {p['runs']:3d} runs {p['wall_s']:.3f} s median {p['median_ms']:.4f} ms | "
                     f"wall {r['wall_ratio']:.3f}x, median {r['median_ratio']:.4f}x")
    return lines


def problems(args: argparse.Namespace) -> list[Path]:
    """The problem files asked for (see the module's docstring)."""
    if args.problems:
        return [Path(p) for p in args.problems]
    picked = [ROOT / "examples" / "problems" / name for name in ("swish.py", "elementwise_chain_small.py")]
    if args.kernelbench:
        picked += [p for p in (Path(args.kernelbench) / name for name in KERNELBENCH_PICKS) if p.is_file()]
    return picked


def main(argv: list[str] | None = None) -> int:
    """Measures every problem and prints (and writes) the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("problems", nargs="*", help="problem files (default: swish, and --kernelbench's picks)")
    parser.add_argument("--kernelbench", default=None, help="KernelBench checkout: add a few of its problems")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the two stopping rules (default 3)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kbmcp-timed-runs-") as tmp:
        for path in problems(args):
            row = measure(path, args.rounds, Path(tmp))
            print("\n".join(report(row)), flush=True)
            rows.append(row)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
