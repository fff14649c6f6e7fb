"""The pool builds a candidate before it takes the GPU lane (`WorkerPool._build_first`, called by
`verify` on a GPU): while another process holds the lane, the build is made and published anyway,
and this process takes no hold for it. Compile-only verifications take no hold at all
(test_lane_pool_processes.py shows that across processes).

No GPU here: the worker the pool would ask is a stand-in saying it has one (its arch and torch are
this machine's); the build itself is real, in the sandbox (a host-only `load_inline` extension, as
in test_ahead.py), and so is the other process holding the lane (`lane_holder.py`).
"""

from __future__ import annotations

import logging
import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ahead_helpers import answer_candidate
from test_machine_lane import Holder

from kb_mcp.harness.builds.toolchain import DEFAULT_ARCH, build_target, extension_name
from kb_mcp.harness.candidate import inline_units_ahead
from kb_mcp.harness.gpu.gpu_key import ENV_LANE_KEY
from kb_mcp.harness.gpu.lane_file import ENV_LANE_DIR
from kb_mcp.harness.gpu.lane_use import LaneUse
from kb_mcp.harness.judgment.options import VerifyOptions
from kb_mcp.harness.pool.pool import WorkerPool
from kb_mcp.harness.protocol import WorkerInfo


def test_a_candidate_is_built_while_another_process_holds_the_lane(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(ENV_LANE_KEY, f"test-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv(ENV_LANE_DIR, str(tmp_path / "lanes"))
    holder = Holder(tmp_path, "timing", "--until-stdin-closes", stdin=subprocess.PIPE)
    holder.until("entered")
    info = WorkerInfo(pid=1, cuda=True, device="a GPU", arch=DEFAULT_ARCH, torch_version=torch.__version__)
    source = answer_candidate(1234)
    said: list[str] = []
    with WorkerPool(tmp_path / "cache", spare=False) as pool, caplog.at_level(logging.INFO, "kb_mcp.harness.gpu.lane"):
        pool._worker = SimpleNamespace(info=info)  # type: ignore[assignment]  # a worker with a GPU, not started
        built = pool._build_first(source, VerifyOptions(), lambda done, total=None, message=None: said.append(
            message or ""))
        pool._worker = None
    assert built and said == ["building the candidate's load_inline extensions before taking the GPU lane"]
    [unit] = inline_units_ahead(source)
    name = extension_name(unit, False, torch.__version__, build_target(DEFAULT_ARCH))
    assert (tmp_path / "cache" / "torch_extensions" / name / f"{name}.so").is_file()
    assert holder.proc.poll() is None  # the other process held the lane all along
    assert "gpu lane:" not in caplog.text  # and this one never took it
    assert holder.proc.stdin is not None
    holder.proc.stdin.close()
    holder.finish()


def test_nothing_is_built_first_without_load_inline_or_without_a_gpu_worker(tmp_path: Path) -> None:
    nvrtc = (Path(__file__).parent / "fixtures" / "relu_nvrtc.py").read_text()
    info = WorkerInfo(pid=1, cuda=True, device="a GPU", arch=DEFAULT_ARCH, torch_version=torch.__version__)
    with WorkerPool(tmp_path / "cache", spare=False) as pool:
        assert not pool._build_first(answer_candidate(5), VerifyOptions(), lambda *a, **k: None)  # no worker yet
        pool._worker = SimpleNamespace(info=info)  # type: ignore[assignment]
        assert not pool._build_first(nvrtc, VerifyOptions(), lambda *a, **k: None)  # NVRTC: nothing to build
        pool._worker = None


def test_lane_use_adds_holds_and_says_what_it_held_beyond_its_gpu_phases() -> None:
    use = LaneUse().add(0.5, 2.0, 3, "g", True).add(0.25, 1.0, 0, "g", False)
    assert (use.waited_s, use.held_s, use.place, use.holds, use.machine) == (0.75, 3.0, 3, 2, False)
    phases = {"build_first": 30.0, "lane": 0.75, "queued": 0.1, "import": 0.2, "check": 1.5, "timing": 0.9}
    assert use.beyond_gpu_phases(phases) == 0.3


@pytest.mark.gpu
def test_on_a_gpu_the_build_waits_for_no_lane_and_the_hold_is_the_gpu_phases(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold load_inline candidate verified while another process holds the lane: built meanwhile,
    then verified once the lane frees, holding it no longer than its GPU phases and a second."""
    import threading
    import time

    from kb_mcp.harness.gpu.gpu_key import gpu_key
    from kb_mcp.harness.problem import load_problem

    monkeypatch.delenv(ENV_LANE_KEY, raising=False)
    monkeypatch.setenv(ENV_LANE_DIR, str(tmp_path / "lanes"))  # this test's own lane of the real GPU key
    examples = Path(__file__).resolve().parents[2] / "examples"
    problem = load_problem(examples / "problems" / "row_sum.py")
    source = (examples / "candidates" / "row_sum_load_inline.py").read_text()  # cold: the test's own cache
    said: list[str] = []
    box: list[object] = []
    with WorkerPool(tmp_path / "cache") as pool:
        pool.info()  # the worker up (its start holds the lane briefly)
        holder = Holder(tmp_path, "timing", "--until-stdin-closes", stdin=subprocess.PIPE)
        holder.until("entered")
        thread = threading.Thread(target=lambda: box.append(pool.verify(problem, source, progress=lambda d, t=None,
                                                                        m=None: said.append(m or ""))))
        thread.start()
        deadline = time.monotonic() + 300
        while not any(m.startswith("waiting for the GPU") for m in said) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert any("before taking the GPU lane" in m for m in said), said  # it built first, then queued
        built = list((tmp_path / "cache" / "torch_extensions").glob("*/*.so"))
        assert built, "nothing was built while the other process held the lane"
        assert holder.proc.stdin is not None
        holder.proc.stdin.close()
        holder.finish()
        thread.join(600)
    (result,) = box
    assert result.verdict.value in ("faster", "slower"), result.summary  # type: ignore[attr-defined]
    lane_use, phases = result.lane, result.phases_s  # type: ignore[attr-defined]
    assert gpu_key() is not None and lane_use is not None and lane_use.machine and lane_use.waited_s > 0
    assert phases["build_first"] > 1.0 and phases.get("import", 0.0) < 1.0, phases  # the worker loaded, built nothing
    assert lane_use.beyond_gpu_phases(phases) <= 1.0, (lane_use, phases)
