"""Profiling without counters: ncu absent or refused (ERR_NVGPUCTRPERM), and the timing fallback.

The lent H100 lets every user read counters (scripts/record_fixtures.py probes it as an unprivileged
user and ncu succeeds there), so the refusal is simulated: a stand-in `ncu` prints ncu's documented
ERR_NVGPUCTRPERM message (tests/fixtures/ncu/err_nvgpuctrperm.txt). Everything else is real: the
profiler spawns it in the sandbox, reads its output, and runs the real driver process for the
fallback. A stand-in writes only where the sandbox lets it: its home, the scratch folder.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest
from prof_fixtures import OWN, PROBLEMS

from kb_mcp.harness.problem import load_problem
from kb_mcp.harness.profile_model import Profile
from kb_mcp.harness.sandbox.sandbox import detect
from kb_mcp.policy.classify import classify_profile
from kb_mcp.profiling import ncu_run, profiler
from kb_mcp.profiling.profiler import kernels_from_trace

ERR_TEXT = (OWN / "err_nvgpuctrperm.txt").read_text()


def _stand_in_ncu(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "ncu"
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _profile_or_no_gpu(tmp_path: Path) -> Profile | None:
    problem = load_problem(str(PROBLEMS / "relu_mul_add.py"))
    try:
        return profiler.profile(problem, None, profile_id="p_00000000ffff", report_base=tmp_path / "rep",
                                cache_dir=tmp_path / "cache", options=profiler.ProfileOptions(timeout_s=240))
    except profiler.NoGpuError:
        return None  # the fallback driver ran and found no GPU (this CPU machine)


def test_permission_error_text_gives_the_reason() -> None:
    reason = profiler.counters_blocked_reason(ERR_TEXT)
    assert reason and reason.startswith("ERR_NVGPUCTRPERM") and "timings only" in reason
    assert profiler.counters_blocked_reason("==PROF== Disconnected from process 1\n") is None


def _spawner(tmp_path: Path, ncu: Path | None = None) -> profiler.Spawner:
    return profiler.Spawner(detect(), tmp_path / "cache", str(ncu) if ncu else None)


def test_refused_counters_fall_back_to_timings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _stand_in_ncu(tmp_path, f"import sys\nsys.stdout.write({ERR_TEXT!r})\nsys.exit(1)\n")
    monkeypatch.setenv(profiler.ENV_NCU, str(fake))
    started: list[list[str]] = []
    real = profiler.NcuProcess

    class Recorded(real):  # the real process, its command line noted
        def __init__(self, cmd, *args, **kwargs) -> None:
            started.append(list(cmd))
            super().__init__(cmd, *args, **kwargs)

    monkeypatch.setattr(ncu_run, "NcuProcess", Recorded)  # where `Spawner.process` finds it
    result = _profile_or_no_gpu(tmp_path)
    args = " ".join(started[0])  # ncu was asked, with the NVTX filter, before falling back
    assert "--nvtx-include kbmcp/" in args and "kb_mcp.harness.worker.profile_driver" in args
    if result is not None:  # on a GPU the timing run succeeds
        assert not result.counters_available and result.method == "timeline"
        assert "ERR_NVGPUCTRPERM" in (result.counters_reason or "")
        assert result.kernels and all((k.metrics.duration_ns or 0) > 0 for k in result.kernels)


def test_absent_ncu_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(profiler.ENV_NCU, "")
    assert profiler.find_ncu() is None
    result = _profile_or_no_gpu(tmp_path)
    if result is not None:
        assert not result.counters_available and "not found" in (result.counters_reason or "")


def test_timeline_trace_parses_into_kernels() -> None:
    trace = json.loads((OWN / "timeline_relu_mul_add.trace.json").read_text())
    kernels = kernels_from_trace(trace)
    assert [k.name for k in kernels] == ["vectorized_elementwise_kernel"] * 3  # relu (clamp), mul, add
    assert [k.index for k in kernels] == [0, 1, 2]
    assert "launch_clamp_scalar" in kernels[0].full_name and "MulFunctor" in kernels[1].full_name
    assert kernels[0].grid[0] > 1 and kernels[0].block == (128, 1, 1)
    assert all(5_000 < (k.metrics.duration_ns or 0) < 100_000 for k in kernels)  # microseconds in the trace
    assert kernels[0].metrics.registers_per_thread == 28
    # without counters the classifier names nothing it cannot see
    result = classify_profile(Profile(profile_id="p_000000000000", problem="x", kernels=kernels,
                                      counters_available=False))
    assert all(k.primary is None for k in result.kernels) and result.overall is None


def test_unknown_metric_is_dropped_and_the_run_repeated(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    fake = _stand_in_ncu(tmp_path, """import os, pathlib, sys
log = pathlib.Path(os.path.expanduser("~/calls"))
log.write_text(log.read_text() + ' '.join(sys.argv) + '\\n' if log.exists() else ' '.join(sys.argv) + '\\n')
args = sys.argv[1:]
metrics = args[args.index('--metrics') + 1] if '--metrics' in args else ''
if 'sm__pipe_tensor_op_gmma_cycles_active' in metrics:
    print('==ERROR== Failed to find metric sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active')
    sys.exit(1)
print('==PROF== Profiling "k" - 0: 0%....50%....100% - 7 passes')
""")
    run, dropped = profiler.profile_target(str(fake), ["true"], scratch / "r", spawner=_spawner(tmp_path, fake),
                                           scratch=scratch, options=profiler.ProfileOptions())
    assert dropped == ["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"]
    assert run.returncode == 0 and run.passes == [7]
    lines = (scratch / "calls").read_text().splitlines()
    assert len(lines) == 2 and "sm__pipe_tensor_op_gmma" not in lines[1] and "gpu__time_duration.sum" in lines[1]


def test_hung_profile_is_killed(tmp_path: Path) -> None:
    start = time.perf_counter()
    run = profiler.run_ncu([sys.executable, "-c", "import time; time.sleep(60)"], _spawner(tmp_path),
                           tmp_path / "s", timeout_s=0.5)
    assert run.timed_out and time.perf_counter() - start < 10


def test_progress_reports_each_profiled_kernel(tmp_path: Path) -> None:
    seen: list[tuple[float, str | None]] = []
    script = ('print("==PROF== Connected to process 1"); '
              'print(\'==PROF== Profiling "void foo<int>(int)" - 0 (1/200): 0%....50%....100% - 33 passes\'); '
              'print(\'==PROF== Profiling "bar" - 1 (2/200): 0%....50%....100% - 33 passes\')')
    run = profiler.run_ncu([sys.executable, "-c", script], _spawner(tmp_path), tmp_path / "s",
                           progress=lambda d, t=None, m=None: seen.append((d, m)))
    assert run.passes == [33, 33]
    assert seen == [(1, "profiling kernel: foo"), (2, "profiling kernel: bar")]


def test_command_line_restricts_to_the_range() -> None:
    cmd = profiler.ncu_command("ncu", Path("/tmp/r"), ["python", "drv.py"], max_kernels=7)
    joined = " ".join(cmd)
    assert "--nvtx --nvtx-include kbmcp/" in joined
    for section in profiler.SECTIONS:
        assert f"--section {section}" in joined
    assert "SourceCounters" not in joined
    assert "--launch-count 7" in joined and "--target-processes application-only" in joined
    assert cmd[-2:] == ["python", "drv.py"]
    assert "SourceCounters" in " ".join(profiler.ncu_command("ncu", Path("/r"), ["x"], source_counters=True))


def test_driver_reports_no_gpu_as_such(tmp_path: Path) -> None:
    """The real driver process, asked for a timing run on a machine without CUDA, says so."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) is None:
        try:
            import torch

            if torch.cuda.is_available():
                pytest.skip("this machine has a GPU: the GPU tests cover the driver")
        except ImportError:
            pass
    problem = load_problem(str(PROBLEMS / "relu_mul_add.py"))
    with pytest.raises(profiler.NoGpuError, match="needs a CUDA GPU"):
        profiler.profile(problem, None, profile_id="p_00000000eeee", report_base=tmp_path / "r",
                         cache_dir=tmp_path, options=profiler.ProfileOptions(counters=False))


BROKEN_PROBLEM = '''import torch
import kbmcp_no_such_module_for_this_test

class Model(torch.nn.Module):
    def forward(self, x):
        return x

def get_inputs():
    return [torch.randn(8)]

def get_init_inputs():
    return []
'''

CANDIDATE = '''import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x
'''


@pytest.mark.parametrize("with_candidate", [False, True])
def test_a_problem_that_fails_to_import_is_the_problems_error(tmp_path: Path, with_candidate: bool) -> None:
    """The real driver process, GPU or not, imports the problem first: its failure is the problem's
    (ProblemFailed, as verify words it), never a missing GPU and never the candidate's."""
    from kb_mcp.harness.problem import parse_problem

    problem = parse_problem(BROKEN_PROBLEM, name="broken", path=str(tmp_path / "broken.py"))
    with pytest.raises(profiler.ProblemFailedError) as caught:
        profiler.profile(problem, CANDIDATE if with_candidate else None, profile_id="p_00000000dddd",
                         report_base=tmp_path / "r", cache_dir=tmp_path,
                         options=profiler.ProfileOptions(counters=False))
    assert caught.value.failed.stage == "import"
    assert "kbmcp_no_such_module_for_this_test" in str(caught.value)
    assert str(caught.value).startswith("its module failed to import") and "candidate" not in str(caught.value)
