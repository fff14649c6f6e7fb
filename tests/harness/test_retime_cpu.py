"""Re-timing a launch-bound reference beside the candidate, on the CPU: the launch-bound criterion,
the interleaving of two timed series (the Timer's host-clock path), the figures a verdict reports
(`timings_against`), the cached baseline's new field, and the seal that keeps a candidate from
slowing the reference it is compared with."""

from __future__ import annotations

import gc
import itertools
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from kb_mcp.harness.baselines import (
    LAUNCH_BOUND_FRACTION,
    MAX_EAGER_DRIFT,
    PROTOCOL,
    Baseline,
    BaselineCache,
    launch_bound,
)
from kb_mcp.harness.worker.loading import load_module
from kb_mcp.harness.worker.seal import ReferenceSeal
from kb_mcp.harness.worker.timing import (
    MAX_RUNS,
    MIN_RUNS,
    QUICK_RUNS,
    RETIME_TIMED_S,
    RunStats,
    Series,
    Timer,
    interleave_order,
    least_runs,
    retime_runs,
    time_with_reference,
    timings_against,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "problems"
_names = itertools.count()


# -- the criterion ------------------------------------------------------------------------------


def test_launch_bound_when_the_host_issues_for_at_least_half_the_call() -> None:
    assert LAUNCH_BOUND_FRACTION == 0.5
    assert launch_bound(0.50, 0.49)  # the 40-launch chain: still issuing at the end
    assert launch_bound(1.0, 0.5)
    assert not launch_bound(1.0, 0.49)
    assert not launch_bound(0.46, 0.02)  # a GPU-bound call: a few launches, then waiting
    assert not launch_bound(1.0, None)  # unknown issue time: the cached figure stands
    assert not launch_bound(0.0, 0.0)


def test_a_baseline_carries_its_issue_time_and_says_whether_it_is_launch_bound(tmp_path: Path) -> None:
    cache = BaselineCache(tmp_path)
    key = ("h", "NVIDIA H100 80GB HBM3", "2.11.0+cu130")
    cache.put(Baseline(problem_hash=key[0], device=key[1], torch_version=key[2], eager_ms=0.5, eager_runs=100,
                       eager_issue_ms=0.48, compile_ms=0.1, compile_runs=100))
    got = cache.get(*key, need_compile=True)
    assert got is not None and got.eager_issue_ms == 0.48 and got.launch_bound
    assert got.protocol == PROTOCOL >= 2
    gpu_bound = got.model_copy(update={"eager_issue_ms": 0.02})
    assert not gpu_bound.launch_bound
    # A file of the protocol before issue times were kept is stale: measured again, not trusted.
    path = cache.path(*key)
    path.write_text(path.read_text().replace(f'"protocol": {PROTOCOL}', '"protocol": 1'))
    assert cache.get(*key, need_compile=True) is None


def test_retimed_runs_fit_a_small_budget() -> None:
    assert retime_runs(0.5, quick=False) == MAX_RUNS  # the chain: 100 runs, 50 ms of eager event time
    assert retime_runs(5.0, quick=False) == int(RETIME_TIMED_S * 1e3 / 5.0)
    assert retime_runs(200.0, quick=False) == MIN_RUNS
    assert retime_runs(0.5, quick=True) == QUICK_RUNS
    assert retime_runs(0.0, quick=False) == MAX_RUNS


# -- interleaving ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b"), [(1, 1), (3, 3), (4, 2), (100, 10), (10, 100), (7, 3), (5, 1)])
def test_interleave_order_spreads_both_series_evenly(a: int, b: int) -> None:
    order = interleave_order(a, b)
    assert order.count(0) == a and order.count(1) == b
    assert order[0] == (0 if a >= b else 1)  # the more frequent series starts; a tie goes to the first
    # No long block of one series while the other waits: at most ceil(a/b) in a row (and vice versa).
    longest = {0: 0, 1: 0}
    for which, group in itertools.groupby(order):
        longest[which] = max(longest[which], len(list(group)))
    assert longest[0] <= -(-a // b) + 1 and longest[1] <= -(-b // a) + 1


def test_interleave_order_alternates_equal_counts() -> None:
    assert interleave_order(3, 3) == [0, 1, 0, 1, 0, 1]
    assert interleave_order(4, 2) == [0, 1, 0, 0, 1, 0]


def test_interleaved_series_run_warmups_then_alternate_with_checks_on_their_own_runs() -> None:
    calls: list[tuple[str, int, bool]] = []
    made: dict[str, list[int]] = {"cand": [], "eager": []}
    checked: list[int] = []

    def maker(tag: str):
        def make(i: int) -> list[int]:
            made[tag].append(i)
            return [i]

        return make

    def cand(i: int) -> int:
        calls.append(("cand", i, gc.isenabled()))
        time.sleep(0.001)
        return i * 2

    def eager(i: int) -> int:
        calls.append(("eager", i, gc.isenabled()))
        time.sleep(0.002)
        return i

    def check(i: int, out: int) -> str | None:
        checked.append(i)
        return "wrong" if i == 3 else None

    timer = Timer.on_host()
    a = Series(cand, maker("cand"), runs=6, warmup=2, check=check)
    b = Series(eager, maker("eager"), runs=3, warmup=1)
    sa, sb = timer.interleaved(a, b)
    # Warm-ups first, untimed and with the collector on; then the timed runs in interleave_order.
    assert calls[:3] == [("cand", -1, True), ("cand", -2, True), ("eager", -1, True)]
    timed = calls[3:]
    assert [0 if tag == "cand" else 1 for tag, _, _ in timed] == interleave_order(6, 3)
    assert [i for tag, i, _ in timed if tag == "cand"] == list(range(6))
    assert [i for tag, i, _ in timed if tag == "eager"] == list(range(3))
    assert not any(enabled for _, _, enabled in timed)  # collector paused for the timed runs
    assert gc.isenabled()
    assert made["cand"] == [-1, -2, *range(6)] and made["eager"] == [-1, *range(3)]
    # Only the candidate's runs are checked; a wrong output is recorded against its run.
    assert checked == list(range(6)) and sa.errors == ["run 3: wrong"] and sb.errors == []
    for stats, runs, slept in ((sa, 6, 1.0), (sb, 3, 2.0)):
        assert len(stats.gpu_ms) == len(stats.host_ms) == len(stats.issue_ms) == runs
        assert all(g >= slept for g in stats.gpu_ms)  # sleep sleeps at least that long
        assert all(i <= h for i, h in zip(stats.issue_ms, stats.host_ms))
        assert stats.issue_median_ms <= stats.host_median_ms


def test_a_single_series_is_the_same_loop() -> None:
    seen: list[int] = []
    stats = Timer.on_host().series(lambda i: seen.append(i), lambda i: [i], 4, 1)
    assert seen == [-1, 0, 1, 2, 3] and len(stats.gpu_ms) == len(stats.issue_ms) == 4 and not stats.errors


def test_a_wall_budget_stops_a_series_only_after_its_least_runs() -> None:
    """A series whose runs are slow stops once its wall budget has passed and it has had MIN_RUNS;
    a fast one makes all its runs; a series asked for fewer than MIN_RUNS makes them all."""
    slow = Timer.on_host().series(lambda i: time.sleep(0.01), lambda i: [i], 200, 1, wall_s=0.05)
    assert len(slow.gpu_ms) == MIN_RUNS == least_runs(200)
    fast = Timer.on_host().series(lambda i: None, lambda i: [i], 50, 1, wall_s=5.0)
    assert len(fast.gpu_ms) == 50
    few = Timer.on_host().series(lambda i: time.sleep(0.01), lambda i: [i], 3, 0, wall_s=0.001)
    assert len(few.gpu_ms) == 3 == least_runs(3)
    unbounded = Timer.on_host().series(lambda i: time.sleep(0.002), lambda i: [i], 30, 0)
    assert len(unbounded.gpu_ms) == 30


def test_interleaved_series_stop_together_once_both_have_their_least_runs() -> None:
    timer = Timer.on_host()
    a = Series(lambda i: time.sleep(0.005), lambda i: [i], runs=100, warmup=0, wall_s=0.02)
    b = Series(lambda i: time.sleep(0.005), lambda i: [i], runs=20, warmup=0)
    sa, sb = timer.interleaved(a, b)
    assert len(sa.gpu_ms) >= MIN_RUNS and len(sb.gpu_ms) >= MIN_RUNS
    assert len(sa.gpu_ms) + len(sb.gpu_ms) < 120  # stopped by the budget, not by the runs asked


# -- the figures a verdict reports -------------------------------------------------------------


def _stats(ms: float, n: int = 5, issue: float | None = None) -> RunStats:
    return RunStats(gpu_ms=[ms] * n, host_ms=[ms * 1.1] * n, issue_ms=[issue if issue is not None else ms * 0.9] * n)


def _base(eager: float = 1.0, issue: float = 0.9, compile_ms: float | None = 0.5, note: str = "") -> Baseline:
    return Baseline(problem_hash="h", device="GPU", torch_version="t", eager_ms=eager, eager_runs=50,
                    eager_issue_ms=issue, compile_ms=compile_ms, compile_runs=50 if compile_ms else 0,
                    compile_note=note)


def test_a_gpu_bound_reference_keeps_its_cached_figures() -> None:
    t = timings_against(_stats(0.25), None, _base(issue=0.05), True, want_compile=True, quick=False, bound_ms=None)
    assert (t.eager_ms, t.compile_ms, t.baseline_cached) == (1.0, 0.5, True)
    assert not t.launch_bound and not t.eager_retimed and not t.compile_scaled
    assert t.eager_cached_ms is None and t.eager_drift is None and t.note == ""
    assert t.speedup_vs_eager == 4.0 and t.speedup_vs_baseline == 2.0


def test_a_cached_baseline_from_a_slow_minute_no_longer_fakes_a_speedup() -> None:
    # Cached at 1.0 ms in a slow minute; beside the candidate the reference now takes 0.6 ms.
    cand, eager = _stats(0.1), _stats(0.6)
    t = timings_against(cand, eager, _base(), True, want_compile=True, quick=False, bound_ms=None)
    assert t.launch_bound and t.eager_retimed and t.baseline_cached
    assert t.eager_ms == 0.6 and t.eager_cached_ms == 1.0 and t.eager_drift == 0.6
    assert t.speedup_vs_eager == pytest.approx(6.0)  # not the 10x the cached figure would claim
    assert t.compile_scaled and t.compile_ms == pytest.approx(0.3)  # 0.5 x 0.6
    assert t.speedup_vs_baseline == pytest.approx(3.0)
    assert "re-timed beside the candidate" in t.note and "0.60x" in t.note and "scaled" in t.note


def test_a_cached_baseline_from_a_fast_minute_no_longer_hides_a_speedup() -> None:
    t = timings_against(_stats(0.1), _stats(1.5), _base(), True, want_compile=False, quick=False, bound_ms=None)
    assert t.eager_retimed and t.eager_drift == 1.5 and t.speedup_vs_eager == pytest.approx(15.0)
    assert t.compile_ms is None and not t.compile_scaled and "scaled" not in t.note


def test_a_reference_slower_than_any_drift_explains_keeps_the_cached_figures() -> None:
    slowed = _stats(1.0 * (MAX_EAGER_DRIFT + 0.5))
    t = timings_against(_stats(0.1), slowed, _base(), True, want_compile=True, quick=False, bound_ms=None)
    assert not t.eager_retimed and not t.compile_scaled
    assert (t.eager_ms, t.compile_ms) == (1.0, 0.5)
    assert t.eager_drift == pytest.approx(MAX_EAGER_DRIFT + 0.5) and t.eager_cached_ms == 1.0
    assert "cached figures are used" in t.note


def _logged(calls: list[str], tag: str, delay: float):
    def fn(i: int) -> int:
        calls.append(tag)
        time.sleep(delay)
        return i

    return fn


def test_which_series_are_timed_for_each_kind_of_baseline() -> None:
    """Cached GPU-bound: the candidate alone. Cached launch-bound: both interleaved. First
    measurement: candidate alone, eager alone, and (eager on the host clock is launch-bound by
    construction) both again interleaved, the pair returned with both rounds' errors."""
    timer = Timer.on_host()
    calls: list[str] = []
    cand = Series(_logged(calls, "c", 0.0005), lambda i: [i], runs=4, warmup=1,
                  check=lambda i, out: "wrong" if i == 0 else None)
    ref = _logged(calls, "e", 0.001)
    gpu_bound = Baseline(problem_hash="h", device="d", torch_version="t", eager_ms=1.0, eager_runs=9,
                         eager_issue_ms=0.05)
    stats, eager = time_with_reference(timer, cand, ref, lambda i: [i], gpu_bound, quick=False)
    assert eager is None and calls == ["c"] * 5 and len(stats.gpu_ms) == 4

    calls.clear()
    host_bound = gpu_bound.model_copy(update={"eager_ms": 1.0, "eager_issue_ms": 1.0})
    stats, eager = time_with_reference(timer, cand, ref, lambda i: [i], host_bound, quick=True)
    assert eager is not None and len(eager.gpu_ms) == QUICK_RUNS == 5
    assert calls[:2] == ["c", "e"] and calls[2:] == [["c", "e"][k] for k in interleave_order(4, 5)]

    calls.clear()
    stats, eager = time_with_reference(timer, cand, ref, lambda i: [i], None, quick=True)
    assert eager is not None and launch_bound(eager.median_ms, eager.issue_median_ms)
    alone = ["c"] * 5 + ["e"] * (1 + QUICK_RUNS)  # warm-up + runs of each, one after the other
    assert calls[: len(alone)] == alone
    assert calls[len(alone):] == ["c", "e"] + [["c", "e"][k] for k in interleave_order(4, QUICK_RUNS)]
    assert len(stats.gpu_ms) == 4 and stats.errors == ["run 0: wrong", "run 0: wrong"]


def test_a_first_measurement_comes_from_the_interleaved_runs() -> None:
    eager = _stats(0.8, issue=0.75)
    base = Baseline(problem_hash="h", device="GPU", torch_version="t", eager_ms=eager.median_ms, eager_runs=5,
                    eager_issue_ms=eager.issue_median_ms, compile_note="torch.compile failed: X")
    t = timings_against(_stats(0.2), eager, base, False, want_compile=True, quick=True, bound_ms=0.01234567)
    assert t.eager_retimed and not t.baseline_cached and t.launch_bound and t.quick
    assert t.eager_ms == 0.8 and t.eager_cached_ms is None and t.eager_drift is None
    assert t.compile_ms is None and t.speedup_vs_baseline == pytest.approx(4.0)
    assert t.note == "torch.compile failed: X" and t.bound_ms == 0.012346


# -- the reference's seal ---------------------------------------------------------------------------


def _problem(tmp_path: Path, name: str = "mlp") -> tuple[object, torch.nn.Module, ReferenceSeal]:
    return _sealed((EXAMPLES / f"{name}.py").read_text(), tmp_path)


def _sealed(source: str, tmp_path: Path) -> tuple[Any, torch.nn.Module, ReferenceSeal]:
    """The problem `source` loaded, its reference built and sealed as the worker does."""
    pmod = load_module(source, f"kbmcp_seal_problem_{next(_names)}", tmp_path)
    seal = ReferenceSeal.of_problem(pmod)
    ref = pmod.Model(*pmod.get_init_inputs()).eval()
    seal.seal_instance(ref)
    return pmod, ref, seal


def test_the_harness_own_use_of_the_reference_changes_nothing(tmp_path: Path) -> None:
    pmod, ref, seal = _problem(tmp_path, "small_cnn")
    x = [t[:2] if isinstance(t, torch.Tensor) else t for t in pmod.get_inputs()]
    with torch.no_grad(), FlopCounterMode(display=False):  # what the harness does before timing
        ref(*x)
    with torch.no_grad():
        ref(*x)
        for p in ref.parameters():  # the perturbed-parameters check writes new values
            p.data.add_(0.1)
    assert seal.changes(pmod, ref) == []


def _slow_forward(self: torch.nn.Module, *args: object) -> object:
    time.sleep(0.001)
    return type(self).forward(self, *args)


@pytest.mark.parametrize("tamper", ["class_forward", "class_call", "instance_forward", "module_function",
                                    "submodule_hook", "global_hook", "submodule_forward", "sizes", "tolerance"])
def test_a_candidate_that_slows_the_reference_is_seen(tmp_path: Path, tamper: str) -> None:
    pmod, ref, seal = _problem(tmp_path)
    handles = []
    if tamper == "class_forward":
        pmod.Model.forward = lambda self, x: self.fc2(self.act(self.fc1(x)))
        want = "Model.forward replaced"
    elif tamper == "class_call":
        pmod.Model.__call__ = _slow_forward
        want = "Model.__call__ added"
    elif tamper == "instance_forward":
        ref.forward = lambda *a: _slow_forward(ref, *a)
        want = "the Model instance: forward added"
    elif tamper == "module_function":
        pmod.get_inputs = list
        want = "problem module: get_inputs replaced"
    elif tamper == "submodule_hook":
        handles.append(ref.fc1.register_forward_hook(lambda *a: time.sleep(0.001)))
        want = "Model.fc1: forward hook added"
    elif tamper == "global_hook":
        handles.append(torch.nn.modules.module.register_module_forward_hook(lambda *a: None))
        want = "global forward hook added"
    elif tamper == "sizes":  # get_inputs reads it at call time: a tiny problem, timed for the real one
        pmod.ROWS = 2
        want = "problem module: ROWS changed from 2048 to 2"
    elif tamper == "tolerance":  # the checks read it after the candidate's import
        pmod.ATOL = 1.0
        want = "problem module: ATOL added"
    else:
        ref.fc2.forward = lambda x: x
        want = "Model.fc2: forward added"
    try:
        changes = seal.changes(pmod, ref)
    finally:
        for h in handles:
            h.remove()
    assert any(want in c for c in changes), changes


def test_a_problem_that_sets_up_a_global_lazily_is_not_a_change(tmp_path: Path) -> None:
    source = (
        "import torch\nimport torch.nn as nn\n\nN = 16\n_scale = None\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, x):\n        global _scale\n        if _scale is None:\n"
        "            _scale = torch.tensor(2.0)\n        return x * _scale\n\n\n"
        "def get_inputs():\n    return [torch.randn(N)]\n\n\ndef get_init_inputs():\n    return []\n"
    )
    pmod, ref, seal = _sealed(source, tmp_path)
    ref(*pmod.get_inputs())
    assert seal.changes(pmod, ref) == []
    pmod.N = 1  # but its sizes stay sealed
    assert seal.changes(pmod, ref) == ["problem module: N changed from 16 to 1"]


def test_a_lazy_module_materialising_is_not_a_change(tmp_path: Path) -> None:
    source = (
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.fc = nn.LazyLinear(8)\n\n    def forward(self, x):\n"
        "        return self.fc(x)\n\n\ndef get_inputs():\n    return [torch.randn(4, 16)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    pmod, ref, seal = _sealed(source, tmp_path)
    with torch.no_grad():
        ref(*pmod.get_inputs())
    assert type(ref.fc) is torch.nn.Linear  # it became its cls_to_become and dropped its hook
    assert seal.changes(pmod, ref) == []
