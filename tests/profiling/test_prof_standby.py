"""Standby profiling drivers: the real driver process waiting for its spec, the pool's rules, and
`profile()` handing a request to the driver it started after the previous one.

Without a GPU the driver still imports torch, waits, claims the spec and reports `device`; on a
GPU (scripts/gpu-check.sh) the same tests see it profile.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prof_fixtures import PROBLEMS, pass_through_ncu

from kb_mcp.harness.problem import load_problem
from kb_mcp.harness.protocol import CLAIMED_FILE, EXIT_UNCLAIMED, DriverReport, DriverSpec
from kb_mcp.harness.sandbox.sandbox import detect
from kb_mcp.kb.errors import SettingError
from kb_mcp.profiling import profiler
from kb_mcp.profiling.profile_standby import StandbyKey, StandbyPool, driver_args, standby_enabled

DRIVER = [sys.executable, "-m", "kb_mcp.harness.worker.profile_driver"]
KEY = StandbyKey("ncu", False, 200, ("a", "b"), "/cache")


def _spec(folder: Path) -> DriverSpec:
    """A spec for a driver waiting in `folder` (the only place it can write)."""
    problem = load_problem(str(PROBLEMS / "relu_mul_add.py"))
    return DriverSpec(problem_source=problem.source, problem_module=f"kbmcp_problem_{problem.hash}",
                      workdir=str(folder / "src"), report_path=str(folder / "driver.json"))


def _wait_until(condition, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _spawner(tmp_path: Path) -> profiler.Spawner:
    return profiler.Spawner(detect(), tmp_path / "cache", None)


def _driver(folder: Path, *, owner: int | None = None, idle_s: float = 120.0) -> profiler.NcuProcess:
    """The real driver in standby, in its sandbox (its folder is its scratch)."""
    folder.mkdir(parents=True, exist_ok=True)
    return _spawner(folder).process(DRIVER + driver_args(folder, idle_s, owner), folder)


def test_standby_driver_runs_the_spec_handed_over(tmp_path: Path) -> None:
    pool = StandbyPool(tmp_path / "pool")
    standby = pool.launch(KEY, lambda folder: _driver(folder))
    assert standby is not None and standby.process.alive()
    _wait_until(standby.ready)  # torch imported (and CUDA up, on a GPU) before any request
    assert standby.process.alive() and not standby.claimed()
    spec = _spec(standby.folder)
    assert pool.take(KEY) is standby
    standby.hand_over(spec)
    run = standby.process.finish(60.0)  # type: ignore[attr-defined]
    assert standby.claimed() and not run.timed_out
    report = DriverReport.model_validate_json(Path(spec.report_path).read_text())
    # The start-up happened before the hand-over; the driver says how long it then waited.
    assert {"import_torch", "standby_wait"} <= set(report.phases_s)
    assert report.phases_s["standby_wait"] > 0
    if report.ok:  # a GPU: one forward ran inside the range
        assert report.device and "forward" in report.phases_s
    else:
        assert report.stage == "device" and run.returncode == profiler.EXIT_NO_GPU
    standby.close()
    assert not standby.folder.exists()


def test_idle_standby_exits_and_a_late_spec_is_not_claimed(tmp_path: Path) -> None:
    proc = _driver(tmp_path / "s", idle_s=0.5)
    run = proc.finish(120.0)
    assert run.returncode == EXIT_UNCLAIMED
    assert (tmp_path / "s" / "ready").is_file() and not (tmp_path / "s" / CLAIMED_FILE).exists()


def test_unconfined_standby_exits_when_its_owner_is_gone(tmp_path: Path) -> None:
    """Unconfined (no pid namespace) a standby watches its owner; a sandboxed one dies with its sandbox."""
    from kb_mcp.harness.sandbox.sandbox import Sandbox

    owner = subprocess.Popen([sys.executable, "-c", "pass"])
    owner.wait()  # a pid that no longer runs
    folder = tmp_path / "s"
    folder.mkdir()
    spawner = profiler.Spawner(Sandbox("unconfined", reason="test"), tmp_path / "cache", None)
    proc = spawner.process(DRIVER + driver_args(folder, 600, owner.pid), folder)
    run = proc.finish(120.0)
    assert run.returncode == EXIT_UNCLAIMED and not run.timed_out


def _sleeper(folder: Path) -> profiler.NcuProcess:
    return _spawner(folder).process([sys.executable, "-c", "import time; time.sleep(120)"], folder)


def test_pool_keeps_one_standby_and_drains_on_other_options(tmp_path: Path) -> None:
    pool = StandbyPool(tmp_path / "pool")
    first = pool.launch(KEY, _sleeper)
    assert first is not None
    assert pool.launch(KEY, _sleeper) is None  # one is waiting already
    other = StandbyKey("ncu", True, 200, ("a", "b"), "/cache")  # source counters: another command line
    assert pool.take(other) is None
    assert not first.process.alive() and not first.folder.exists()  # drained, not left beside a cold run
    assert pool.take(KEY) is None

    second = pool.launch(KEY, _sleeper)
    assert second is not None
    second.process.kill()
    assert pool.take(KEY) is None and not second.folder.exists()  # a dead standby is not handed out


def test_disabled_or_closed_pool_starts_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = StandbyPool(tmp_path / "pool")
    waiting = pool.launch(KEY, _sleeper)
    assert waiting is not None
    pool.disable("counters refused")
    assert not waiting.process.alive() and pool.launch(KEY, _sleeper) is None

    pool = StandbyPool(tmp_path / "pool2")
    pool.close()
    assert pool.launch(KEY, _sleeper) is None

    monkeypatch.setenv("KB_MCP_PROFILE_STANDBY", "0")
    assert StandbyPool(tmp_path / "pool3").launch(KEY, _sleeper) is None


def test_metrics_dropped_once_stay_dropped(tmp_path: Path) -> None:
    pool = StandbyPool(tmp_path / "pool")
    pool.dropped_metrics.add("b")
    assert pool.metrics(["a", "b", "c"]) == ["a", "c"]


def test_folders_of_dead_owners_are_swept(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", "pass"])
    owner.wait()
    root = tmp_path / "pool"
    stale = root / f"standby-{owner.pid}-deadbeef"
    mine = root / f"standby-{os.getpid()}-cafef00d"
    stale.mkdir(parents=True)
    mine.mkdir()
    StandbyPool(root)
    assert not stale.exists() and mine.exists()


def test_profile_hands_the_next_request_to_the_standby(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(profiler.ENV_NCU, str(pass_through_ncu(tmp_path)))
    problem = load_problem(str(PROBLEMS / "relu_mul_add.py"))
    pool = StandbyPool(tmp_path / "pool")
    kw = dict(cache_dir=tmp_path / "cache", options=profiler.ProfileOptions(timeout_s=240), standby=pool)
    try:
        first = profiler.profile(problem, None, profile_id="p_0000000000f1", report_base=tmp_path / "r1", **kw)
    except profiler.NoGpuError:
        # No GPU: the driver said so, and the pool starts no driver that could only say it again.
        assert pool.disabled_reason and pool.take(KEY) is None
        assert not list((tmp_path / "pool").glob("standby-*"))
        return
    try:
        assert "standby_wait" not in first.phases_s  # the first request starts cold
        key_folders = list((tmp_path / "pool").glob("standby-*"))
        assert len(key_folders) == 1  # and leaves a driver waiting for the next one
        second = profiler.profile(problem, None, profile_id="p_0000000000f2", report_base=tmp_path / "r2", **kw)
        assert "standby_wait" in second.phases_s and second.device == first.device
        assert not key_folders[0].exists()  # used once, then removed
    finally:
        pool.close()
    assert not list((tmp_path / "pool").glob("standby-*"))


def test_verification_waits_for_a_driver_still_starting(tmp_path: Path) -> None:
    """compile_and_verify times candidates: it lets a starting driver finish its start-up first."""
    from kb_mcp.tools.context import ToolContext

    ctx = ToolContext(tmp_path / "kb.json", cache_dir=tmp_path / "cache")
    start = time.monotonic()
    ctx.settle_profiler(5.0)  # no profile yet: nothing to wait for
    assert time.monotonic() - start < 0.5
    assert ctx.profilers is not None
    ctx.profilers.launch(KEY, _sleeper)  # never writes "ready": still starting
    start = time.monotonic()
    ctx.settle_profiler(0.6)
    assert 0.5 < time.monotonic() - start < 5.0
    ctx.close()
    assert not list((tmp_path / "cache" / "profile-standby").glob("standby-*"))


def test_refused_counters_start_no_waiting_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ncu saying ERR_NVGPUCTRPERM: the profile falls back to timings, and no driver is left waiting
    under an ncu that will refuse again."""
    from prof_fixtures import OWN

    err = (OWN / "err_nvgpuctrperm.txt").read_text()
    script = tmp_path / "ncu"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({err!r})\nsys.exit(1)\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(profiler.ENV_NCU, str(script))
    pool = StandbyPool(tmp_path / "pool")
    problem = load_problem(str(PROBLEMS / "relu_mul_add.py"))
    try:
        result = profiler.profile(problem, None, profile_id="p_0000000000f3", report_base=tmp_path / "r",
                                  cache_dir=tmp_path / "cache", options=profiler.ProfileOptions(timeout_s=240),
                                  standby=pool)
        assert not result.counters_available  # a GPU: the timing fallback ran
    except profiler.NoGpuError:
        pass  # this machine: the fallback driver found no GPU
    assert pool.disabled_reason and "ERR_NVGPUCTRPERM" in pool.disabled_reason
    assert not list((tmp_path / "pool").glob("standby-*"))


@pytest.mark.parametrize(("value", "on"), [("0", False), ("off", False), ("No", False), ("false", False),
                                           ("1", True), ("on", True), ("YES", True), ("true", True), ("", True)])
def test_standby_takes_the_documented_words(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    monkeypatch.setenv("KB_MCP_PROFILE_STANDBY", value)
    assert standby_enabled() is on


@pytest.mark.parametrize("value", ["maybe", "2", "disabled", "nope"])
def test_a_standby_setting_of_another_word_is_refused_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              value: str) -> None:
    """Not read as on (nor as off): the operator meant something kb-mcp cannot tell."""
    monkeypatch.setenv("KB_MCP_PROFILE_STANDBY", value)
    with pytest.raises(SettingError) as refused:
        StandbyPool(tmp_path / "pool").launch(KEY, _sleeper)
    assert refused.value.whose == "environment" and refused.value.where == "KB_MCP_PROFILE_STANDBY"
    assert f"$KB_MCP_PROFILE_STANDBY={value!r} is not one of '1', 'true', 'yes', 'on', '0'" in str(refused.value)
    assert not (tmp_path / "pool").exists() or not any((tmp_path / "pool").iterdir())  # no driver started
