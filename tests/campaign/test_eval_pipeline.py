"""The pipelined eval (`campaign/eval_pipeline.py`, `campaign/evaluate.py`): builds ahead run in parallel
in the sandbox and the worker finds them; the serial and the pipelined eval give the same verdicts; the
progress carries the ETA; an interrupted eval leaves no compiler running; while a step waits for its
build, the GPU times the baselines not cached (the waiting problem's first). Real builds, real
compilers, real worker processes and threads (compile-only where a GPU would verify)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from ahead_helpers import answer_candidate, descendants, gone

from kb_mcp.campaign.eta import OVERALL
from kb_mcp.campaign.eval_baselines import BaselinesAhead, Pending
from kb_mcp.campaign.eval_models import EvalOptions, EvalResult
from kb_mcp.campaign.eval_pipeline import Pipeline
from kb_mcp.campaign.evaluate import evaluate
from kb_mcp.harness.baselines import Baseline, BaselineCache
from kb_mcp.harness.builds.ahead import AheadTarget, BuildsAhead
from kb_mcp.harness.builds.toolchain import DEFAULT_ARCH
from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.problem import load_problem
from kb_mcp.kb.models import Verdict
from kb_mcp.tools.context import ToolContext

ROOT = Path(__file__).resolve().parents[2]
TREE = Path(__file__).resolve().parent / "kernelbench_tree"
SOLUTIONS = TREE / "solutions"
COMPILERS = ("nvcc", "cicc", "cc1plus", "ptxas", "kb_mcp.harness.worker.build")

Progress = Callable[[str, int, int, str], None]
Log = Callable[[str], None]


def _evaluate(tmp: Path, jobs: int, *, tree: Path = TREE, solutions: Path = SOLUTIONS, compile_only: bool = True,
              progress: Progress | None = None, log: Log | None = None) -> tuple[EvalResult, int, int]:
    """An eval in a KB, cache and folder of its own: (its result, compiler processes its verifications
    started themselves, extensions the pool built for its workers)."""
    ctx = ToolContext(tmp / "kb.json", cache_dir=tmp / "cache")
    try:
        result = evaluate(tmp / "out", ctx, EvalOptions(problems=[str(tree)], solutions=str(solutions),
                                                        compile_only=compile_only, build_jobs=jobs),
                          have_gpu=not compile_only, progress=progress, log=log)
        return result, ctx.workers.compile_only.running.started, ctx.workers.builds.builds
    finally:
        ctx.close()


def _verdicts(result: EvalResult) -> dict[str, tuple[Verdict | None, str]]:
    return {line.problem: (line.verdict, line.note) for line in result.lines}


@pytest.mark.nvcc
def test_serial_and_pipelined_evals_give_the_same_verdicts(tmp_path: Path) -> None:
    serial, serial_compiles, _ = _evaluate(tmp_path / "serial", 0)
    overall: list[str] = []
    logged: list[str] = []

    def progress(problem: str, done: int, total: int, message: str) -> None:
        if problem == OVERALL:
            overall.append(message)

    piped, piped_compiles, _ = _evaluate(tmp_path / "piped", 2, progress=progress, log=logged.append)
    assert _verdicts(piped) == _verdicts(serial)
    assert {p: v for p, (v, _) in _verdicts(piped).items()} == {
        "1_Scale": Verdict.needs_gpu, "2_Add_Bias": Verdict.needs_gpu, "3_Square": None,
        "1_Scale_Add_ReLU": Verdict.compile_error}
    assert "expected a \";\"" in _verdicts(piped)["1_Scale_Add_ReLU"][1]  # the compiler's words, as serial
    # every compiler run of the pipelined eval was made ahead: its verifications found them all cached
    assert serial_compiles >= 3 and piped_compiles == 0
    assert any("building 3 solution(s) ahead, 2 at a time, for compile-only checks" in m for m in logged)
    assert overall[0].startswith("ETA unknown") and overall[-1] == "done · 3/3 built ahead"
    assert any(m.startswith("ETA about") for m in overall)  # after the first problem, said as such
    times = {line.problem: line.times for line in piped.lines}
    assert times["3_Square"] is None  # no solution: nothing verified
    for name in ("1_Scale", "2_Add_Bias", "1_Scale_Add_ReLU"):
        t = times[name]
        # each figure is rounded to the millisecond on its own: the parts may exceed the whole by 1.5 ms
        assert t is not None and t.wall_s >= t.wait_s + t.verify_s - 0.0015 - 1e-9 and t.verify_s > 0


def test_the_pipeline_builds_ahead_in_parallel_and_the_worker_finds_each_build(tmp_path: Path) -> None:
    """Two solutions built ahead at once (GPU mode: the build service, in the sandbox), then imported
    by the worker's own builder in the census worker: found by name, the pool builds nothing."""
    with WorkerPool(tmp_path / "cache", no_cuda=True, spare=False) as pool:
        info = pool.info()
        ahead = BuildsAhead(pool.cache_dir, pool.sandbox, AheadTarget(
            compile_only=False, arch=info.arch or DEFAULT_ARCH, torch_version=info.torch_version))
        sources = [answer_candidate(value) for value in (11, 12)]
        with Pipeline(ahead.build, 2, ahead.stop) as pipe:
            for i, source in enumerate(sources):
                pipe.submit(i, source)
            outcomes = [pipe.claim(i)[1] for i in range(len(sources))]
            assert pipe.counts() == (2, 2)
        assert [(o.built, o.failed) for o in outcomes if o is not None] == [(1, 0), (1, 0)]
        assert ahead.running.peak == 2 and ahead.running.started == 2  # both builds ran at once
        relu = load_problem(ROOT / "tests" / "harness" / "fixtures" / "relu_problem.py")
        for source in sources:
            reply = pool.census(relu, source)
            assert reply.failure is None and reply.clean, reply
        assert pool.builds.builds == 0


SLOW = '''"""A load_inline solution whose compile-only check takes a while (torch's headers, twice)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA = r"""
#include <torch/extension.h>
torch::Tensor scale(torch::Tensor x) { return x; }  // VARIANT
"""

_ext = load_inline(name="slow_VARIANT", cpp_sources="torch::Tensor scale(torch::Tensor x);", cuda_sources=CUDA,
                   functions=["scale"])


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return _ext.scale(x)
'''


@pytest.mark.nvcc
@pytest.mark.slow
def test_an_interrupted_eval_leaves_no_compiler_running(tmp_path: Path) -> None:
    """Ctrl-C while the first problem waits for its build ahead (the next ones building too): the
    eval stops, and every compiler it started ahead is gone."""
    tree = tmp_path / "tree" / "level1"
    solutions = tmp_path / "solutions"
    tree.mkdir(parents=True)
    solutions.mkdir()
    for name in ("1_Scale", "2_Add_Bias", "3_Square"):
        shutil.copy(TREE / "KernelBench" / "level1" / f"{name}.py", tree)
        (solutions / f"{name}.py").write_text(SLOW.replace("VARIANT", name[2:]))
    seen: list[list[str]] = []
    interrupted_at: list[float] = []

    def progress(problem: str, done: int, total: int, message: str) -> None:
        if message.startswith("waiting for its build ahead"):
            seen.append([c for c in descendants(os.getpid()) if any(w in c for w in COMPILERS)])
            interrupted_at.append(time.monotonic())
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _evaluate(tmp_path, 2, tree=tree, solutions=solutions, progress=progress)
    # the compilers were stopped, not waited for (three checks over torch's headers take far longer)
    assert time.monotonic() - interrupted_at[0] < 15
    assert seen and seen[0], "the interrupt came while compilers ran ahead"
    assert gone(COMPILERS)


SQUARE = '''"""3_Square in load_inline: y = x * x (torch's headers on the C++ side, a plain CUDA launcher)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = r"""
void launch_square(const float* x, float* y, long long n, void* stream);

torch::Tensor forward(torch::Tensor x, int64_t stream) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x: float32 on the GPU");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    if (x.numel() > 0) {
        launch_square(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), reinterpret_cast<void*>(stream));
    }
    return y;
}
"""

CUDA = r"""
#include <cuda_runtime.h>

__global__ void square(const float* __restrict__ x, float* __restrict__ y, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * x[i];
}

void launch_square(const float* x, float* y, long long n, void* stream) {
    square<<<(unsigned)((n + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(x, y, n)MISSING;
}
"""

_ext = load_inline(name="NAME", cpp_sources=CPP, cuda_sources=CUDA, functions=["forward"])


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return _ext.forward(x, torch.cuda.current_stream(x.device).cuda_stream)
'''


def _kind(verdict: Verdict | None) -> str | None:
    """faster and slower are one kind here: two timings of one kernel near 1.0x may fall either side."""
    return "valid" if verdict in (Verdict.faster, Verdict.slower) else (verdict.value if verdict else None)


@pytest.mark.gpu
def test_on_a_gpu_the_pipelined_eval_builds_ahead_and_judges_as_the_serial_one(tmp_path: Path) -> None:
    """Real verifications on the GPU: a load_inline solution built ahead is found by the verify worker
    (the pool builds only the one that fails), a build that fails ahead is reported by the verification
    exactly as serially, and every verdict is the serial eval's."""
    solutions = tmp_path / "solutions"
    shutil.copytree(SOLUTIONS, solutions)
    (solutions / "3_Square.py").write_text(SQUARE.replace("NAME", "tree_square").replace("MISSING", ""))
    # the problem's own file name wins over the sample one: a load_inline solution whose CUDA does not compile
    (solutions / "level1" / "2_Add_Bias.py").write_text(SQUARE.replace("NAME", "tree_broken").replace("MISSING", "x"))
    serial, _, serial_builds = _evaluate(tmp_path / "serial", 0, solutions=solutions, compile_only=False)
    piped, _, piped_builds = _evaluate(tmp_path / "piped", 2, solutions=solutions, compile_only=False)
    kinds = {line.problem: (_kind(line.verdict), line.note) for line in piped.lines}
    assert kinds == {line.problem: (_kind(line.verdict), line.note) for line in serial.lines}
    assert {p: k for p, (k, _) in kinds.items()} == {"1_Scale": "valid", "2_Add_Bias": "compile_error",
                                                     "3_Square": "valid", "1_Scale_Add_ReLU": "compile_error"}
    # built before the lane (serially by the verification's own build first, pipelined ahead), the pool
    # itself built only the broken one, again under the lane, to report its error as a verification does
    assert serial_builds == 1 and piped_builds == 1
    square = {line.problem: line.times for line in piped.lines}["3_Square"]
    cold = {line.problem: line.times for line in serial.lines}["3_Square"]
    assert square is not None and cold is not None and square.build_s < 2.0 < cold.build_s


def test_a_claim_gives_the_idle_time_to_other_work_until_the_awaited_work_is_done() -> None:
    """While the work of a key runs (a real thread), `idle` is called piece after piece; it stops being
    called once the work is done or once it has nothing left; its time is not counted as waited."""
    release = threading.Event()
    pieces: list[str] = []

    def work(item: str) -> str:
        release.wait(10)
        return item

    def piece() -> bool:
        pieces.append("piece")
        if len(pieces) == 3:
            release.set()  # the build finishes during the third piece
        time.sleep(0.2)
        return True

    with Pipeline(work, 1) as pipe:
        pipe.submit(0, "built")
        t0 = time.monotonic()
        waited, result = pipe.claim(0, idle=piece)
        assert result == "built" and len(pieces) == 3  # no fourth piece: the work was done
        assert waited < 0.2 < time.monotonic() - t0  # the pieces' 0.6 s are not waiting
    calls: list[int] = []
    release.clear()
    with Pipeline(work, 1) as pipe:
        pipe.submit(0, "late")

        def nothing_left() -> bool:
            calls.append(1)
            threading.Timer(0.3, release.set).start()
            return False

        waited, result = pipe.claim(0, idle=nothing_left)
        assert result == "late" and calls == [1] and waited >= 0.25  # asked once, then it waited
    with Pipeline(work, 0) as serial:  # nothing runs ahead: nothing to wait for, no idle work
        assert serial.claim(0, idle=piece) == (0.0, None) and len(pieces) == 3


def _pending(index: int, name: str) -> Pending:
    return Pending(index, name, load_problem(TREE / "KernelBench" / "level1" / f"{name}.py"))


def test_baselines_ahead_start_with_the_waiting_problem_and_skip_cached_and_verified_ones(tmp_path: Path) -> None:
    """A real pool (no GPU: each run says needs_gpu and caches nothing): the waiting problem's baselines
    first, then the next ones in order; a problem cached for the pool's GPU and torch is never timed, nor
    one whose verification has started; with none left, `one` says so."""
    said: list[tuple[int, str, str]] = []
    reports: list[str] = []
    with WorkerPool(tmp_path / "cache", no_cuda=True, spare=False) as pool:
        info = pool.info()
        scale, add, square = _pending(0, "1_Scale"), _pending(1, "2_Add_Bias"), _pending(2, "3_Square")
        BaselineCache(pool.cache_dir).put(Baseline(  # 2_Add_Bias is cached for this worker's GPU and torch
            problem_hash=add.problem.hash, device=info.device, torch_version=info.torch_version, eager_ms=1.0,
            eager_runs=10, compile_ms=1.0, compile_runs=10))
        ahead = BaselinesAhead(pool, VerifyOptions(), [scale, add, square], lambda i, n, t: said.append((i, n, t)))
        assert [p.name for p in ahead.left] == ["1_Scale", "3_Square"]
        assert ahead.one(1, "2_Add_Bias", reports.append)  # 2_Add_Bias waits: 1_Scale was verified, 3_Square next
        assert [(i, n) for i, n, _ in said] == [(2, "3_Square")]
        assert "needs_gpu" in said[0][2] and "timed ahead while 2_Add_Bias's build finished" in said[0][2]
        assert reports[0] == "its build is not done: the GPU times the baselines of 3_Square meanwhile"
        assert not ahead.one(2, "3_Square", reports.append) and ahead.timed == set()  # none left; nothing cached
        assert ahead.seconds > 0
    with WorkerPool(tmp_path / "cache2", no_cuda=True, spare=False) as pool:
        said.clear()
        ahead = BaselinesAhead(pool, VerifyOptions(), [scale, add, square], lambda i, n, t: said.append((i, n, t)))
        assert ahead.one(0, "1_Scale", reports.append) and ahead.one(0, "1_Scale", reports.append)
        assert [n for _, n, _ in said] == ["1_Scale", "2_Add_Bias"]  # its own first, then the next in order


@pytest.mark.gpu
def test_on_a_gpu_the_first_build_hides_behind_the_baselines_of_its_problem(tmp_path: Path) -> None:
    """The first problem's cold load_inline build has no verification to hide behind: the GPU times its
    baselines meanwhile (cached, so its verification finds them), and the verdict is the serial eval's,
    whose verification measured them itself."""
    tree = tmp_path / "tree" / "level1"
    solutions = tmp_path / "solutions"
    tree.mkdir(parents=True)
    solutions.mkdir()
    shutil.copy(TREE / "KernelBench" / "level1" / "3_Square.py", tree)
    (solutions / "3_Square.py").write_text(SQUARE.replace("NAME", "first_square").replace("MISSING", ""))
    logged: list[str] = []
    piped, _, _ = _evaluate(tmp_path / "piped", 1, tree=tree, solutions=solutions, compile_only=False,
                            log=logged.append)
    serial, _, _ = _evaluate(tmp_path / "serial", 0, tree=tree, solutions=solutions, compile_only=False)
    [p], [s] = piped.lines, serial.lines
    assert _kind(p.verdict) == _kind(s.verdict) == "valid" and p.note == s.note
    assert p.baseline_ahead and p.baseline_cached and p.times is not None and p.times.baselines_s > 0
    assert not s.baseline_ahead and s.baseline_cached is False  # serially, measured inside the verification
    assert any("timed ahead while 3_Square's build finished" in m for m in logged), logged
    assert any("baselines of 1 of 1 problem(s) not cached" in m for m in logged), logged
