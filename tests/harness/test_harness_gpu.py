"""The harness on a real GPU: honest and wrong candidates, both build styles, and device-side faults.

Every fault must end in its verdict within its limit, and the next candidate must then run
normally (on a replaced worker where the fault spoiled the old one).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from harness_helpers import fixture_source, with_fault

from kb_mcp.harness.baselines import BaselineCache
from kb_mcp.harness.judgment.integrity_static import check_source
from kb_mcp.harness.judgment.verdict import FindingCode, VerifyOptions
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.problem import load_problem, parse_problem
from kb_mcp.kb.models import Verdict

pytestmark = pytest.mark.gpu

VALID = (Verdict.faster, Verdict.slower)
QUICK = VerifyOptions(timing=False, compile_baseline=False)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory):
    with WorkerPool(tmp_path_factory.mktemp("gpu-cache")) as p:
        yield p


def _normal(pool: WorkerPool, problem) -> None:
    result = pool.verify(problem, fixture_source("relu_nvrtc.py"), QUICK)
    assert result.verdict in VALID, result.summary
    assert not result.findings and all(s.passed for s in result.input_sets)


def test_honest_nvrtc_candidate_is_verified_and_timed(pool: WorkerPool, relu_problem) -> None:
    result = pool.verify(relu_problem, fixture_source("relu_nvrtc.py"))
    assert result.verdict in VALID, result.summary
    assert result.findings == [] and not result.flagged
    kinds = [s.kind for s in result.input_sets]
    assert kinds.count("secret") >= 5 and {"public_seed", "shifted", "repeat", "reused_buffers"} <= set(kinds)
    assert all(s.passed and s.numel == 2048 * 1024 for s in result.input_sets)
    t = result.timings
    assert t is not None and t.runs >= 10 and 0 < t.candidate_min_ms <= t.candidate_ms
    assert t.eager_ms and t.compile_ms and t.speedup_vs_baseline == pytest.approx(min(t.eager_ms,
                                                                                      t.compile_ms) / t.candidate_ms,
                                                                                      rel=1e-3)
    assert result.compile.style == "nvrtc" and result.compile.kernels == ["relu_k"]
    assert result.device and result.arch.startswith("sm_")
    # the first verdict of the problem: its baselines timed first, in a worker no candidate ran in
    assert not t.baseline_cached and result.phases_s.get("reference_baselines", 0) > 0, result.phases_s
    again = pool.verify(relu_problem, fixture_source("relu_nvrtc.py") + "\n# same kernel, new candidate id\n")
    assert again.timings is not None and again.timings.baseline_cached
    assert "reference_baselines" in again.phases_s and again.phases_s["reference_baselines"] < 0.5, again.phases_s
    # the cached baseline, not a new measurement (a launch-bound reference is re-timed beside the candidate)
    a = again.timings
    cached_eager = t.eager_cached_ms if t.launch_bound else t.eager_ms
    assert (a.eager_cached_ms if a.launch_bound else a.eager_ms) == cached_eager, a


def test_the_timing_worker_never_profiles_and_the_census_runs_beside_it(pool: WorkerPool, relu_problem) -> None:
    result = pool.verify(relu_problem, fixture_source("relu_nvrtc.py") + "\n# census in its own process\n", QUICK)
    assert result.verdict in VALID and result.findings == [], result.summary
    state = pool.state()
    assert state["verify"].profiler_sessions == 0
    assert state["census"].profiler_sessions >= 2  # its warm-up, then this candidate's census
    assert state["census"].info.pid != state["verify"].info.pid


# Crashes only where the census runs: under the profiler, in the census worker.
CENSUS_ONLY_ABORT = "import os\nif torch.autograd.profiler._is_profiler_enabled:\n    os.abort()"


def test_a_crash_under_the_profiler_costs_the_census_worker_only(pool: WorkerPool, relu_problem) -> None:
    restarts, census_restarts = pool.restarts, pool.census_restarts
    result = pool.verify(relu_problem, with_fault("forward", CENSUS_ONLY_ABORT), QUICK)
    assert result.verdict == Verdict.crashed, result.summary
    assert "SIGABRT" in result.summary and "census" in result.summary, result.summary
    assert result.timings is None and not result.worker_replaced
    assert pool.restarts == restarts and pool.census_restarts == census_restarts + 1
    _normal(pool, relu_problem)


def test_a_candidate_more_exact_than_the_reference_is_judged_against_float64(pool: WorkerPool) -> None:
    # The float32 reference's own rounding exceeds the tolerance of the small outputs: the sets the
    # candidate fails by that margin are judged against a float64 copy of the reference, and pass;
    # so do the set with new values in old buffers (inputs made again from their seed) and the
    # outputs of the timed runs.
    problem = load_problem(Path(__file__).parent / "fixtures" / "seqsum_problem.py")
    result = pool.verify(problem, fixture_source("seqsum_nvrtc_double.py"), QUICK)
    assert result.verdict in VALID, (result.summary, [f.message for f in result.findings])
    arbitrated = [s for s in result.input_sets if s.float64_ratio is not None]
    assert {"secret", "reused_buffers"} <= {s.kind for s in arbitrated}, [s.message for s in result.input_sets]
    assert not any(f.code == FindingCode.timed_output_mismatch for f in result.findings), result.findings
    assert all(s.passed and s.mismatched > 0 and (s.float64_ratio or 0.0) < 1.0 for s in arbitrated), arbitrated
    assert "judged against float64" in arbitrated[0].message


def test_wrong_kernel_is_incorrect(pool: WorkerPool, relu_problem) -> None:
    result = pool.verify(relu_problem, fixture_source("relu_nvrtc_wrong.py"), QUICK)
    assert result.verdict == Verdict.incorrect, result.summary
    assert result.timings is None and any(not s.passed and s.mismatched > 0 for s in result.input_sets)


def test_nvrtc_compile_error(pool: WorkerPool, relu_problem) -> None:
    result = pool.verify(relu_problem, fixture_source("relu_nvrtc_cuda_error.py"), QUICK)
    assert result.verdict == Verdict.compile_error, result.summary
    assert any("undeclared_value" in m for m in result.compile.messages), result.compile.messages


def test_load_inline_builds_once_then_comes_from_the_cache(pool: WorkerPool, relu_problem) -> None:
    first = pool.verify(relu_problem, fixture_source("relu_inline.py"), QUICK)
    assert first.verdict in VALID, first.summary
    assert first.compile.style == "load_inline" and first.findings == []
    second = pool.verify(relu_problem, fixture_source("relu_inline.py") + "\n# another candidate id\n", QUICK)
    assert second.verdict in VALID and second.compile.cached and second.compile.seconds < 5


def test_load_inline_compile_error_reports_the_compiler(pool: WorkerPool, relu_problem) -> None:
    result = pool.verify(relu_problem, fixture_source("relu_inline_cuda_error.py"), QUICK)
    assert result.verdict == Verdict.compile_error, result.summary
    assert any("error" in m for m in result.compile.messages), result.compile.messages


ILLEGAL = '''
bad = torch.cuda._compile_kernel(
    'extern "C" __global__ void bad(float* p) { p[threadIdx.x + (1ull << 40)] = 1.0f; }', "bad")
bad(grid=(1, 1, 1), block=(32, 1, 1), args=[x])
torch.cuda.synchronize()
'''
SPIN = '''
spin = torch.cuda._compile_kernel('extern "C" __global__ void spin(volatile int* f) { while (f[0] == 0) { } }', "spin")
flag = torch.zeros(1, dtype=torch.int32, device="cuda")
spin(grid=(1, 1, 1), block=(1, 1, 1), args=[flag])
torch.cuda.synchronize()
'''


@pytest.mark.parametrize(
    ("code", "verdict", "words", "replaced"),
    [
        (ILLEGAL, Verdict.crashed, "illegal memory access", True),
        (SPIN, Verdict.timeout, "timeout", True),
        ("torch.empty(1 << 47, dtype=torch.uint8, device='cuda')", Verdict.crashed, "out of GPU memory", False),
        ("import ctypes\nctypes.string_at(0)", Verdict.crashed, "SIGSEGV", True),
        ("import os\nos.abort()", Verdict.crashed, "SIGABRT", True),
        ("while True:\n    pass", Verdict.timeout, "timeout", True),
    ],
    ids=["illegal-address", "kernel-infinite-loop", "huge-allocation", "host-segfault", "abort", "host-infinite-loop"],
)
def test_fault_in_forward_gets_its_verdict_and_the_next_candidate_runs(
    pool: WorkerPool, relu_problem, code: str, verdict: Verdict, words: str, replaced: bool
) -> None:
    restarts = pool.restarts
    t0 = time.monotonic()
    result = pool.verify(relu_problem, with_fault("forward", code), VerifyOptions(timeout_s=8, timing=False))
    assert result.verdict == verdict and words in result.summary, result.summary
    assert time.monotonic() - t0 < 120
    assert result.worker_replaced == replaced and pool.restarts == restarts + int(replaced)
    _normal(pool, relu_problem)


def test_output_flood_in_forward_is_truncated(pool: WorkerPool, relu_problem) -> None:
    flood = "import sys\nsys.stdout.write('y' * 200000 + '\\n')"
    result = pool.verify(relu_problem, with_fault("forward", flood), VerifyOptions(max_output_chars=1000, timing=False))
    assert result.verdict in VALID, result.summary
    assert "omitted" in result.output and len(result.output) < 1200
    _normal(pool, relu_problem)


def _example(problem: str, candidate: str):
    return load_problem(EXAMPLES / "problems" / f"{problem}.py"), (EXAMPLES / "candidates" / candidate).read_text()


def test_a_launch_bound_reference_is_retimed_beside_each_candidate(pool: WorkerPool) -> None:
    problem, source = _example("elementwise_chain_small", "elementwise_chain_small_nvrtc.py")
    first = pool.verify(problem, source)
    t = first.timings
    assert first.verdict in VALID and t is not None, first.summary
    # First verdict: both baselines timed first in a worker no candidate ran in (and cached), eager
    # then re-timed beside the candidate all the same, as for every launch-bound reference.
    assert t.launch_bound and t.eager_retimed and not t.baseline_cached and t.eager_cached_ms, t
    marks: list[tuple[str, float]] = []
    again = pool.verify(problem, source + "\n# new candidate id\n",
                        progress=lambda done, total=None, message=None: marks.append((str(message), time.monotonic())))
    a = again.timings
    assert again.verdict in VALID and a is not None, again.summary
    assert a.baseline_cached and a.launch_bound and a.eager_retimed, a
    assert a.eager_cached_ms == t.eager_cached_ms and a.eager_drift == pytest.approx(a.eager_ms / a.eager_cached_ms,
                                                                                     rel=1e-3)
    assert a.speedup_vs_eager == pytest.approx(a.eager_ms / a.candidate_ms, rel=1e-3)
    assert t.eager_drift and a.compile_scaled
    assert a.compile_ms / a.eager_drift == pytest.approx(t.compile_ms / t.eager_drift, rel=1e-2)  # one cached figure
    assert "re-timed beside the candidate" in a.note
    phases = {m.split(" (")[0]: round(b - t0, 3) for (m, t0), (_, b) in itertools.pairwise(marks)}
    # The verdict's own account of its seconds: every phase it went through, adding up to the whole.
    assert {"queued", "import", "check", "timing"} <= set(again.phases_s), again.phases_s
    assert sum(again.phases_s.values()) == pytest.approx(again.elapsed_s, abs=0.01)
    print(f"chain: eager cached {t.eager_ms:.4f} ms, re-timed {a.eager_ms:.4f} ms (drift {a.eager_drift}), "
          f"candidate {a.candidate_ms:.4f} ms ({a.runs} runs); verdict {again.elapsed_s:.2f} s (first "
          f"{first.elapsed_s:.2f} s, {first.phases_s}); progress marks {phases}")


def test_a_gpu_bound_reference_comes_from_the_cache(pool: WorkerPool) -> None:
    problem, source = _example("swish", "swish_nvrtc.py")
    opts = VerifyOptions(compile_baseline=False)
    first = pool.verify(problem, source, opts)
    t = first.timings
    assert first.verdict in VALID and t is not None, first.summary
    assert not t.launch_bound and not t.eager_retimed and not t.baseline_cached  # timed first, alone
    again = pool.verify(problem, source + "\n# new candidate id\n", opts)
    a = again.timings
    assert a is not None and a.baseline_cached and not a.launch_bound and not a.eager_retimed, a
    assert a.eager_ms == t.eager_ms and a.eager_drift is None and a.eager_cached_ms is None
    print(f"swish: eager {a.eager_ms:.4f} ms cached; verdict {again.elapsed_s:.2f} s")


# Slows the reference it is compared with: wraps the problem's Model.forward at import.
SLOW_REFERENCE = """
import sys, time
for _name, _mod in list(sys.modules.items()):
    if _name.startswith("kbmcp_problem"):
        _ref = getattr(_mod, "Mo" + "del")
        _orig = _ref.forward
        def _slow(self, *args, _f=_orig):
            time.sleep(0.002)
            return _f(self, *args)
        _ref.forward = _slow
"""


def test_a_candidate_that_slows_the_reference_is_invalid(pool: WorkerPool, relu_problem) -> None:
    result = pool.verify(relu_problem, with_fault("import", SLOW_REFERENCE), QUICK)
    assert result.verdict == Verdict.invalid and result.timings is None, result.summary
    assert any(f.code == FindingCode.harness_tampering and "Model.forward replaced" in f.message
               for f in result.findings), result.findings
    _normal(pool, relu_problem)


# Switches torch.compile off in its own process, in a form the static rules do not read (dynamo's
# name built at run time, its setting through `config.patch`): had torch.compile been timed there
# after the candidate, its figure would be eager's.
COMPILE_OFF = """
import importlib as _il
_il.import_module("torch." + "_dyn" + "amo").config.patch(disable=True).__enter__()
"""


def test_a_candidate_cannot_change_the_torch_compile_baseline(pool: WorkerPool) -> None:
    problem, source = _example("elementwise_chain_small", "elementwise_chain_small_nvrtc.py")
    problem = parse_problem(problem.source + "\n# a problem of its own: no baselines cached\n", problem.name)
    cheat = source.replace("import functools\n", "import functools\n" + COMPILE_OFF, 1)
    assert cheat != source and check_source(cheat) == []  # the runtime's to stop, not the static rules'
    result = pool.verify(problem, cheat)
    # the trusted snapshot watches torch.compile's own settings: switching dynamo off is tampering
    assert result.verdict is Verdict.invalid, result.summary
    assert any(f.code is FindingCode.harness_tampering and "torch._dynamo.config" in f.message
               for f in result.findings), result.findings
    cached = BaselineCache(pool.cache_dir).get(problem.hash, result.device, pool.info().torch_version,
                                               need_compile=True)
    assert cached is not None and cached.compile_ms is not None
    # torch.compile fuses the 40 launches into one: timed with dynamo off it would cost what eager does
    assert cached.compile_ms < 0.6 * cached.eager_ms, cached
    # and the next candidate, in the worker the cheat ran in, is judged against those same figures
    again = pool.verify(problem, source + "\n# new candidate id\n")
    assert again.timings is not None and again.timings.baseline_cached, again.summary
    assert again.timings.eager_cached_ms == round(cached.eager_ms, 6)  # Timings keeps six decimals
    print(f"chain: eager {cached.eager_ms:.4f} ms, torch.compile {cached.compile_ms:.4f} ms (timed before the "
          f"candidate that switches dynamo off); first verdict {result.elapsed_s:.2f} s, {result.phases_s}")


SLOW_SETS = """
import time as _time
_get_inputs = get_inputs
_made = [0]


def get_inputs():
    # The verify worker makes one set as it loads the problem and about twelve in the checks; each
    # of those takes 0.4 s more here, as a 16 GiB set's copies to the host and back do. The timing's
    # own sets (one per timed run) come after, at full speed.
    _made[0] += 1
    if _made[0] <= 13:
        _time.sleep(0.4)
    return _get_inputs()
"""


def test_each_input_set_of_the_checks_has_the_whole_limit(pool: WorkerPool) -> None:
    """About twelve input sets at 0.4 s of the harness's own work each pass a limit of 2.5 s: the
    limit restarts at each set, so a large problem's checks are not the candidate's timeout."""
    problem, source = _example("swish", "swish_nvrtc.py")
    problem = parse_problem(problem.source + SLOW_SETS, problem.name)
    result = pool.verify(problem, source, VerifyOptions(timing=False, compile_baseline=False, timeout_s=2.5))
    assert result.verdict not in (Verdict.timeout, Verdict.crashed), result.summary
    assert all(s.passed for s in result.input_sets) and len(result.input_sets) >= 8, result.input_sets
    assert result.phases_s["check"] > 2.5, result.phases_s  # the whole phase took longer than one limit
    print(f"{len(result.input_sets)} sets, check phase {result.phases_s['check']:.1f} s under a 2.5 s limit")
