"""The worker pool on any machine: the compile-only path, worker lifecycle, and host-side faults.

The pool here is a compile-only one (`no_cuda=True`), so these tests behave the same with or without
a GPU. Compile-only never runs the candidate: its sources are read statically and compiled in the
sandbox. Candidate code runs, on CPU, in the census worker (import, constructor, forward): the
faults are injected there. Each must end in its own verdict within its limit, and the next candidate
must run normally on a replaced worker.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from harness_helpers import fixture_source, with_fault

from kb_mcp.harness.judgment.verdict import FindingCode, VerifyOptions
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.kb.models import Verdict

CPU_CANDIDATE = '''
import torch
import torch.nn as nn

IMPORT_FAULT


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        INIT_FAULT

    def forward(self, x):
        return torch.clamp(x, min=0)
'''


def cpu_candidate(at_import: str = "pass", in_init: str = "pass") -> str:
    """A candidate that runs on CPU (in the census worker), with code injected at import or in __init__."""
    init = "\n        ".join(in_init.strip().splitlines())
    return CPU_CANDIDATE.replace("IMPORT_FAULT", at_import.strip()).replace("INIT_FAULT", init)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory):
    with WorkerPool(tmp_path_factory.mktemp("cache"), no_cuda=True, spare=False) as p:
        yield p


def _next_is_normal(pool: WorkerPool, problem) -> None:
    assert pool.census(problem, cpu_candidate()).clean


def test_worker_starts_without_cuda_and_reports_itself(pool: WorkerPool) -> None:
    info = pool.info()
    assert info.cuda is False and info.torch_version and info.pid != os.getpid()
    assert info.sandbox_pid not in (0, info.pid)  # its own pid namespace


@pytest.mark.nvcc
def test_nvrtc_candidate_compiles_and_needs_gpu(pool: WorkerPool, relu_problem) -> None:
    steps: list[str] = []
    result = pool.verify(relu_problem, fixture_source("relu_nvrtc.py"), progress=lambda d, t=None,
                         m=None: steps.append(m))
    assert result.verdict == Verdict.needs_gpu and result.compile.ok and result.compile.style == "nvrtc"
    assert result.compile.kernels == ["relu_k"] and result.compile.arch == "sm_90a" and result.arch == "sm_90"
    assert "compiling the candidate's CUDA sources" in steps and steps[-1] == "needs_gpu"
    assert result.candidate_id.startswith("c_") and result.problem_hash == relu_problem.hash


@pytest.mark.nvcc
def test_cuda_error_gives_compile_error_with_the_compilers_line(pool: WorkerPool, relu_problem) -> None:
    result = pool.verify(relu_problem, fixture_source("relu_nvrtc_cuda_error.py"))
    assert result.verdict == Verdict.compile_error
    assert any("relu_k.cu(4): error" in m and "undeclared_value" in m for m in result.compile.messages), (
        result.compile.messages
    )


def test_python_errors_are_caught_before_any_worker_runs_them(pool: WorkerPool, relu_problem) -> None:
    restarts = pool.restarts
    result = pool.verify(relu_problem, "class ModelNew(:\n  pass\n")
    assert result.verdict == Verdict.compile_error and "syntax error at line 1" in result.summary
    result = pool.verify(relu_problem, "import torch\nclass Other: pass\n")
    assert result.verdict == Verdict.compile_error and "ModelNew" in result.summary
    assert pool.restarts == restarts


@pytest.mark.nvcc
def test_compile_only_never_runs_the_candidate(pool: WorkerPool, relu_problem, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for where in ("import", "init"):
        source = with_fault(where, f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit(3)")
        result = pool.verify(relu_problem, source)
        assert result.verdict == Verdict.needs_gpu and result.output == "", result.summary
    assert not marker.exists()


def test_sources_built_at_run_time_are_named_not_guessed(pool: WorkerPool, relu_problem) -> None:
    source = fixture_source("relu_nvrtc.py").replace("_compile_kernel(SRC,", "_compile_kernel(SRC.strip(),")
    result = pool.verify(relu_problem, source)
    assert result.verdict == Verdict.needs_gpu
    assert any("computed at run time" in m for m in result.compile.messages), result.compile.messages


def test_an_exception_at_import_is_a_crash_with_its_message(pool: WorkerPool, relu_problem) -> None:
    reply = pool.census(relu_problem, cpu_candidate(at_import="import kbmcp_no_such_module"))
    assert reply.verdict == Verdict.crashed and "kbmcp_no_such_module" in reply.summary
    _next_is_normal(pool, relu_problem)


def test_host_crash_in_constructor_costs_one_worker(pool: WorkerPool, relu_problem) -> None:
    # (a segfault in forward: test_census_worker_cpu)
    restarts = pool.census_restarts
    reply = pool.census(relu_problem, cpu_candidate(in_init="import os\nos.abort()"))
    assert reply.verdict == Verdict.crashed and "SIGABRT" in reply.summary, reply.summary
    assert pool.census_restarts == restarts + 1
    _next_is_normal(pool, relu_problem)


def test_host_infinite_loop_times_out_at_its_limit(pool: WorkerPool, relu_problem) -> None:
    t0 = time.monotonic()
    reply = pool.census(
        relu_problem, cpu_candidate(in_init="while True:\n    pass"), VerifyOptions(compile_timeout_s=4)
    )
    took = time.monotonic() - t0
    assert reply.verdict == Verdict.timeout and "4 s" in reply.summary
    assert 3.5 < took < 30, took
    _next_is_normal(pool, relu_problem)


def test_output_flood_does_not_block(pool: WorkerPool, relu_problem) -> None:
    flood = "import sys\nfor _ in range(40000):\n    sys.stdout.write('x' * 999 + '\\n')\nprint('LAST LINE')"
    t0 = time.monotonic()
    assert pool.census(relu_problem, cpu_candidate(in_init=flood)).clean
    assert time.monotonic() - t0 < 60
    assert pool._census is not None and "LAST LINE" in pool._census.output.take(2000)
    _next_is_normal(pool, relu_problem)


def test_writing_a_fake_result_to_the_channel_is_forged_result(pool: WorkerPool, relu_problem) -> None:
    forge = (
        "import json, os, stat, struct\n"
        "body = json.dumps({'kind': 'result', 'rid': 'x', 'seq': 0, 'body': {'kind': 'census'}}).encode()\n"
        "for fd in map(int, os.listdir('/proc/self/fd')):\n"
        "    try:\n"
        "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
        "            os.write(fd, struct.pack('>I', len(body)) + body + bytes(32))\n"
        "    except OSError:\n"
        "        pass"
    )
    restarts = pool.census_restarts
    reply = pool.census(relu_problem, cpu_candidate(at_import=forge))
    assert reply.verdict == Verdict.invalid and pool.census_restarts == restarts + 1
    assert [f.code for f in reply.findings] == [FindingCode.forged_result]
    _next_is_normal(pool, relu_problem)


def test_a_process_left_running_retires_the_worker(pool: WorkerPool, relu_problem) -> None:
    restarts = pool.census_restarts
    reply = pool.census(relu_problem, cpu_candidate(in_init="import subprocess\nsubprocess.Popen(['sleep', '60'])"))
    assert reply.verdict is None  # not a cheat by itself; but the next candidate gets a fresh worker
    assert pool.census_restarts == restarts + 1
    _next_is_normal(pool, relu_problem)


def test_a_worker_killed_from_outside_is_replaced_on_the_next_request(pool: WorkerPool, relu_problem) -> None:
    _next_is_normal(pool, relu_problem)
    assert pool._census is not None
    pid = pool._census.pid
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    _next_is_normal(pool, relu_problem)
    assert pool._census.pid != pid


def test_close_stops_the_worker(tmp_path, relu_problem) -> None:
    p = WorkerPool(tmp_path, no_cuda=True, spare=False)
    pid = p.info().pid
    p.close()
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)


def test_a_retirement_names_the_threads_and_processes_left_running() -> None:
    import subprocess
    import threading

    from kb_mcp.harness.worker.main import _left_running, _processes

    before, procs = set(threading.enumerate()), _processes()
    assert _left_running(before, None) == ""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="left-by-candidate", daemon=True)
    t.start()
    child = subprocess.Popen(["sleep", "30"])
    try:
        why = _left_running(before, procs)
        # named by its pid (its name may still be the parent's until it has exec'd)
        assert "1 thread(s) (left-by-candidate)" in why and f"[{child.pid}]" in why, why
        assert "process(es)" in why and why.endswith("left running"), why  # (others of the machine may start too)
        assert _left_running(before, None).count("process") == 0  # outside a PID namespace: threads only
    finally:
        stop.set()
        child.kill()
        child.wait()
        t.join()
    assert _left_running(before, None) == ""
    assert child.pid not in _processes()
