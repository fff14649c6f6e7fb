"""Two processes verifying through the harness's own entry point (`WorkerPool.verify`: what
`kb-mcp eval`, the benches and tests call) at the same time never overlap on a GPU: the pool takes
the GPU lane itself, around the GPU work only. Their lane logs, on the machine-wide monotonic
clock, prove it.

On CPU (`nvcc`) the pool's compile-only path runs real nvcc builds in the sandbox, under an explicit
key (`KB_MCP_LANE_KEY`) held all along by a third process: the compile-only verifications never wait
for the lane (nothing of them runs on a GPU). On a GPU (`gpu`) each process checks and times the
example candidate for real, keyed by the GPU's UUID in the machine's own lane folder, each holds the
lane no longer than its GPU phases and a second, and the baseline the first verification measured
is cached (it held the GPU alone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from kb_mcp.harness.baselines import BaselineCache
from kb_mcp.harness.gpu import lane
from kb_mcp.harness.gpu.gpu_key import ENV_LANE_KEY
from kb_mcp.harness.gpu.lane_file import ENV_LANE_DIR
from kb_mcp.harness.gpu.lane_use import LaneUse

ROOT = Path(__file__).resolve().parents[2]
VERIFIER = Path(__file__).with_name("lane_verifier.py")
HOLDER = Path(__file__).with_name("lane_holder.py")
PROBLEM = ROOT / "examples" / "problems" / "swish.py"
CANDIDATE = ROOT / "examples" / "candidates" / "swish_nvrtc.py"

pytestmark = [pytest.mark.slow]


def _two_verifiers(tmp_path: Path, env: dict[str, str], times: int) -> tuple[list[lane.LaneSpan],
                                                                               list[list[dict[str, Any]]], list[int]]:
    """Starts two verifying processes at once; their holds, their results and their pids."""
    run = uuid.uuid4().hex[:6]
    procs, logs = [], []
    for i in range(2):
        logs.append(tmp_path / f"verifier{i}.log")
        procs.append(subprocess.Popen(
            [sys.executable, str(VERIFIER), str(PROBLEM), str(CANDIDATE), f"{run}-{i}", "--times", str(times)],
            stdout=subprocess.PIPE, stderr=logs[-1].open("wb"), text=True, cwd=ROOT,
            env={**os.environ, "KB_MCP_CACHE": str(tmp_path / "cache"), **env}))
    results = []
    for proc, log in zip(procs, logs):
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, log.read_text(errors="replace")
        results.append([json.loads(line) for line in out.splitlines()])
    spans = lane.read_spans("".join(log.read_text(errors="replace") for log in logs))
    return spans, results, [p.pid for p in procs]


def _no_overlap(spans: list[lane.LaneSpan], pids: list[int], times: int) -> None:
    assert all(s.machine for s in spans), spans
    verifies = [s for s in spans if s.what == "verify swish"]
    assert sorted(s.pid for s in verifies) == sorted(pids * times)  # every verification held the lane
    starts = [s.pid for s in spans if s.what == "start the harness worker"]
    assert len(starts) + len(verifies) == len(spans) and sorted(starts) == sorted(set(starts)), spans
    assert lane.overlapping(spans) == [], lane.overlapping(spans)
    assert any(s.waited_s > 0.05 for s in spans)  # they did contend for it


@pytest.mark.nvcc
def test_compile_only_verifications_build_while_another_process_holds_the_lane(tmp_path: Path) -> None:
    key = f"test-{uuid.uuid4().hex[:8]}"
    env = {ENV_LANE_KEY: key, ENV_LANE_DIR: str(tmp_path / "lanes")}
    holder = subprocess.Popen([sys.executable, str(HOLDER), "timing", "--until-stdin-closes"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, **env})
    try:
        assert holder.stdout is not None and '"entered"' in holder.stdout.readline()
        spans, results, _ = _two_verifiers(tmp_path, env, 2)
        assert holder.poll() is None  # the lane was held by the other process all along
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    assert spans == []  # no compile-only verification took it
    flat = [r for rs in results for r in rs]
    assert [r["verdict"] for r in flat] == ["needs_gpu"] * 4, results
    assert all(r["lane"] is not None and r["lane"]["holds"] == 0 for r in flat), flat


@pytest.mark.gpu
def test_two_processes_verifying_at_once_never_share_the_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_LANE_KEY, raising=False)
    monkeypatch.delenv(ENV_LANE_DIR, raising=False)  # the machine's own lane folder, as every kb-mcp uses it
    spans, results, pids = _two_verifiers(tmp_path, {}, 2)
    _no_overlap(spans, pids, 2)
    (gpu,) = {s.gpu for s in spans}
    assert gpu.startswith(("GPU-", "MIG-")), gpu  # keyed by the UUID nvidia-smi gives
    flat = [r for rs in results for r in rs]
    for r in flat:  # the lane held for the GPU phases only (the work under it), a second at most beside them
        use = LaneUse.model_validate(r["lane"])
        assert use.holds == 1 and use.machine and use.beyond_gpu_phases(r["phases_s"]) <= 1.0, r
    assert {r["verdict"] for r in flat} <= {"faster", "slower"}, flat
    assert all(r["baseline_not_cached"] == "" for r in flat), flat
    first = flat[0]
    cached = BaselineCache(tmp_path / "cache").get(first["problem_hash"], first["device"], first["torch_version"],
                                                   need_compile=False)
    assert cached is not None, "the baseline measured while holding the GPU alone was not cached"
