"""A profiling driver started before any profile (a server's start): the real driver in standby, in
the real pool of a real ToolContext, under a pass-through ncu. Without a GPU the driver still starts,
waits and takes the spec (then reports `device`); on a GPU the same test sees it profile.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from prof_fixtures import PROBLEMS, pass_through_ncu

from kb_mcp.harness.problem import load_problem
from kb_mcp.profiling import profiler
from kb_mcp.server import prewarm as server_prewarm
from kb_mcp.tools import profile_kernel
from kb_mcp.tools.context import ToolContext

PROBLEM = PROBLEMS / "relu_mul_add.py"


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ToolContext:
    monkeypatch.setenv(profiler.ENV_NCU, str(pass_through_ncu(tmp_path)))
    context = ToolContext(tmp_path / "kb.json", cache_dir=tmp_path / "cache")
    yield context
    context.close()


def _folders(ctx: ToolContext) -> list[Path]:
    return list((ctx.cache_dir / "profile-standby").glob("standby-*"))


def test_the_warmed_driver_is_the_one_a_default_request_takes(
        ctx: ToolContext, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kb_mcp.harness.gpu.lane")
    standby = profile_kernel.prewarm(ctx)
    assert standby is not None and ctx.profilers is not None and ctx.profilers.waiting is standby
    assert "gpu lane: profiling driver warm-up entered" in caplog.text  # launched under the lane, as after a profile
    assert standby.ready()  # and its start-up ran under the lane too (no other process's timing beside it)
    # What a request with only a problem computes, through the function profile_kernel.run uses.
    request = profile_kernel.Request(problem=str(PROBLEM))
    options = profile_kernel.profile_options(request)
    ncu = profiler.find_ncu()
    assert ncu is not None
    assert standby.key == profiler.standby_key(ncu, options, ctx.cache_dir, ctx.profilers)
    assert profile_kernel.prewarm(ctx) is None and len(_folders(ctx)) == 1  # the pool keeps one

    said: list[str] = []
    start = time.perf_counter()
    try:
        result = profiler.profile(load_problem(str(PROBLEM)), None, profile_id="p_0000000000e1",
                                  report_base=tmp_path / "r", cache_dir=ctx.cache_dir, options=options,
                                  progress=lambda done, total, message: said.append(message or ""),
                                  standby=ctx.profilers, sandbox=ctx.sandbox)
        assert "standby_wait" in result.phases_s  # a GPU: the warmed driver ran the forward
    except profiler.NoGpuError:
        pass  # no GPU: the driver took the spec and said so
    print(f"first profile on the warmed driver: {time.perf_counter() - start:.2f} s")
    assert "handing the model to the waiting profiler" in said
    assert "starting the model under Nsight Compute" not in said  # no cold run


def test_a_non_default_request_drains_the_warmed_driver(ctx: ToolContext) -> None:
    assert profile_kernel.prewarm(ctx) is not None
    ncu = profiler.find_ncu()
    assert ncu is not None and ctx.profilers is not None
    other = profile_kernel.profile_options(profile_kernel.Request(problem=str(PROBLEM), source_counters=True))
    assert ctx.profilers.take(profiler.standby_key(ncu, other, ctx.cache_dir, ctx.profilers)) is None
    assert ctx.profilers.waiting is None and not _folders(ctx)  # never two ncu sessions at once


def test_nothing_is_warmed_where_standby_is_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(profiler.ENV_NCU, str(pass_through_ncu(tmp_path)))
    one_shot = ToolContext(tmp_path / "kb.json", cache_dir=tmp_path / "cache", standby_profiler=False)
    assert profile_kernel.prewarm(one_shot) is None and one_shot.profilers is None  # as `kb-mcp call` makes it
    assert server_prewarm.warm_profiler(one_shot) is None

    monkeypatch.setenv("KB_MCP_PROFILE_STANDBY", "0")
    ctx = ToolContext(tmp_path / "kb.json", cache_dir=tmp_path / "cache")
    assert server_prewarm.warm_profiler(ctx) is None
    assert profile_kernel.prewarm(ctx) is None
    assert not list((tmp_path / "cache" / "profile-standby").glob("standby-*"))
    ctx.close()


def test_a_closed_context_warms_nothing(ctx: ToolContext) -> None:
    """The warm-up thread may reach its launch after the server stopped: nothing may start then."""
    ctx.close()
    assert profile_kernel.prewarm(ctx) is None
    assert server_prewarm.warm(ctx) is None
    assert not _folders(ctx)


def test_warm_logs_when_the_driver_is_ready(ctx: ToolContext, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kb_mcp.server.prewarm")
    took = server_prewarm.warm(ctx)
    assert took is not None and took > 0
    assert "warming a profiling driver" in caplog.text and "profiling driver ready" in caplog.text
    pool = ctx.profilers
    assert pool is not None and pool.waiting is not None and pool.waiting.ready()
    process = pool.waiting.process
    ctx.close()  # the server stops: its driver with it
    assert not process.alive() and not _folders(ctx)
