"""The worker pool on any machine: lifecycle, isolation and host-side faults, and the compile-only path.

The pool here is a compile-only one (`no_cuda=True`), so these tests behave the same with or without
a GPU. The faults happen where compile-only runs candidate code: at import and in ModelNew's
constructor. Each must end in its own verdict within its limit, and the next candidate must run
normally on a replaced worker.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from kb_mcp.harness.verdict import FindingCode, VerifyOptions
from kb_mcp.harness.worker import WorkerPool
from kb_mcp.kb.models import Verdict

from harness_helpers import fixture_source, with_fault

pytestmark = pytest.mark.nvcc  # honest candidates are compiled with nvcc


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory):
    with WorkerPool(tmp_path_factory.mktemp("cache"), no_cuda=True) as p:
        yield p


def _next_is_normal(pool: WorkerPool, problem) -> None:
    result = pool.verify(problem, fixture_source("relu_nvrtc.py"))
    assert result.verdict == Verdict.needs_gpu, result.summary
    assert not result.worker_replaced


def test_worker_starts_without_cuda_and_reports_itself(pool: WorkerPool) -> None:
    info = pool.info()
    assert info["cuda"] is False and info["torch_version"] and info["pid"] != os.getpid()


def test_nvrtc_candidate_compiles_and_needs_gpu(pool: WorkerPool, relu_problem) -> None:
    steps: list[str] = []
    result = pool.verify(relu_problem, fixture_source("relu_nvrtc.py"), progress=lambda d, t=None, m=None: steps.append(m))
    assert result.verdict == Verdict.needs_gpu and result.compile.ok and result.compile.style == "nvrtc"
    assert result.compile.kernels == ["relu_k"] and result.compile.arch == "sm_90"
    assert "importing and building the candidate" in steps and steps[-1] == "needs_gpu"
    assert result.candidate_id.startswith("c_") and result.problem_hash == relu_problem.hash


def test_cuda_error_gives_compile_error_with_the_compilers_line(pool: WorkerPool, relu_problem) -> None:
    result = pool.verify(relu_problem, fixture_source("relu_nvrtc_cuda_error.py"))
    assert result.verdict == Verdict.compile_error
    assert any("relu_k.cu(4): error" in m and "undeclared_value" in m for m in result.compile.messages), result.compile.messages


def test_python_errors_are_caught_before_any_worker_runs_them(pool: WorkerPool, relu_problem) -> None:
    restarts = pool.restarts
    result = pool.verify(relu_problem, "class ModelNew(:\n  pass\n")
    assert result.verdict == Verdict.compile_error and "syntax error at line 1" in result.summary
    result = pool.verify(relu_problem, "import torch\nclass Other: pass\n")
    assert result.verdict == Verdict.compile_error and "ModelNew" in result.summary
    assert pool.restarts == restarts


def test_an_exception_at_import_is_a_crash_with_its_message(pool: WorkerPool, relu_problem) -> None:
    result = pool.verify(relu_problem, with_fault("import", "import kbmcp_no_such_module"))
    assert result.verdict == Verdict.crashed and "kbmcp_no_such_module" in result.summary
    _next_is_normal(pool, relu_problem)


@pytest.mark.parametrize(
    ("fault", "signame"),
    [
        ("import ctypes\nctypes.string_at(0)", "SIGSEGV"),
        ("import os\nos.abort()", "SIGABRT"),
    ],
    ids=["segfault", "abort"],
)
def test_host_crash_in_constructor_costs_one_worker(pool: WorkerPool, relu_problem, fault: str, signame: str) -> None:
    restarts = pool.restarts
    result = pool.verify(relu_problem, with_fault("init", fault))
    assert result.verdict == Verdict.crashed and signame in result.summary, result.summary
    assert result.worker_replaced and pool.restarts == restarts + 1
    _next_is_normal(pool, relu_problem)


def test_host_infinite_loop_times_out_at_its_limit(pool: WorkerPool, relu_problem) -> None:
    t0 = time.monotonic()
    result = pool.verify(relu_problem, with_fault("init", "while True:\n    pass"), VerifyOptions(compile_timeout_s=4))
    took = time.monotonic() - t0
    assert result.verdict == Verdict.timeout and "4 s" in result.summary and result.worker_replaced
    assert 3.5 < took < 30, took
    _next_is_normal(pool, relu_problem)


def test_output_flood_is_truncated_and_does_not_block(pool: WorkerPool, relu_problem) -> None:
    flood = "import sys\nfor _ in range(40000):\n    sys.stdout.write('x' * 999 + '\\n')\nprint('LAST LINE')"
    result = pool.verify(relu_problem, with_fault("init", flood), VerifyOptions(max_output_chars=2000))
    assert result.verdict == Verdict.needs_gpu, result.summary
    assert "omitted" in result.output and result.output.rstrip().endswith("LAST LINE")
    assert len(result.output) < 2200
    _next_is_normal(pool, relu_problem)


def test_writing_a_fake_result_to_the_channel_is_forged_result(pool: WorkerPool, relu_problem) -> None:
    forge = (
        "import json, os, stat, struct\n"
        "body = json.dumps({'type': 'result', 'verdict': 'faster'}).encode()\n"
        "for fd in map(int, os.listdir('/proc/self/fd')):\n"
        "    try:\n"
        "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
        "            os.write(fd, struct.pack('>I', len(body)) + body + bytes(32))\n"
        "    except OSError:\n"
        "        pass"
    )
    result = pool.verify(relu_problem, with_fault("import", forge))
    assert result.verdict == Verdict.invalid and result.worker_replaced
    assert [f.code for f in result.findings] == [FindingCode.forged_result]
    _next_is_normal(pool, relu_problem)


def test_printing_a_fake_result_to_stdout_changes_nothing(pool: WorkerPool, relu_problem) -> None:
    fake = "print('{\"type\": \"result\", \"verdict\": \"faster\", \"speedup\": 100}')"
    result = pool.verify(relu_problem, with_fault("import", fake))
    assert result.verdict == Verdict.needs_gpu and '"speedup": 100' in result.output


def test_a_thread_left_running_retires_the_worker(pool: WorkerPool, relu_problem) -> None:
    restarts = pool.restarts
    code = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()"
    result = pool.verify(relu_problem, with_fault("import", code))
    assert result.verdict == Verdict.invalid and FindingCode.background_thread in [f.code for f in result.findings]
    assert result.worker_replaced and pool.restarts == restarts + 1
    _next_is_normal(pool, relu_problem)


def test_a_worker_killed_from_outside_is_replaced_on_the_next_request(pool: WorkerPool, relu_problem) -> None:
    pid = pool.info()["pid"]
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    _next_is_normal(pool, relu_problem)
    assert pool.info()["pid"] != pid


def test_close_stops_the_worker(tmp_path, relu_problem) -> None:
    p = WorkerPool(tmp_path, no_cuda=True)
    pid = p.info()["pid"]
    p.close()
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)
