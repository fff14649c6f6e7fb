"""`kb-mcp run-campaign` as a command: configuration errors, an LLM endpoint that fails mid-run,
parallel trajectories, and rebuilding the report from raw records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from campaign_helpers import ROOT, SWISH, campaign_command, campaign_env, run_campaign_process
from fakellm import Answer, FakeLLMServer, Rule
from fakellm.campaign_script import campaign_script

from kb_mcp.campaign.store import CampaignStore


def test_unconfigured_llm_is_a_clear_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_MCP_LLM_")}
    env["KB_MCP_HOME"] = str(tmp_path / "home")
    proc = subprocess.run(
        [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(tmp_path / "kb.json"), "run-campaign", str(SWISH)],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "no LLM is configured" in proc.stderr and "KB_MCP_LLM_BASE_URL" in proc.stderr
    assert not (tmp_path / "kb.artifacts").exists()  # nothing was started


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("KB_MCP_LLM_TIMEOUT", "abc", "a valid number"),
    ("KB_MCP_LLM_TIMEOUT", "-5", "greater than 0"),
    ("KB_MCP_LLM_MAX_RETRIES", "-1", "greater than or equal to 0"),
    ("KB_MCP_LLM_MAX_RETRIES", "2.5", "a valid integer"),
])
def test_an_llm_setting_that_cannot_be_used_is_named_before_anything_starts(
        tmp_path: Path, variable: str, value: str, said: str) -> None:
    env = {**os.environ, "KB_MCP_HOME": str(tmp_path / "home"), "KB_MCP_LLM_BASE_URL": "http://127.0.0.1:9/v1",
           "KB_MCP_LLM_MODEL": "m", variable: value}
    proc = subprocess.run(
        [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(tmp_path / "kb.json"), "run-campaign", str(SWISH)],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"${variable}={value!r} cannot be used" in proc.stderr and said in proc.stderr
    assert not (tmp_path / "kb.artifacts").exists()  # nothing was started


@pytest.mark.parametrize(("flags", "said"), [
    (["--iterations", "-1"], "--iterations -1: input should be greater than or equal to 1"),
    (["--top-k", "0"], "--top-k 0: input should be greater than or equal to 1"),
    (["--temperature", "-3"], "--temperature -3.0: input should be greater than or equal to 0"),
])
def test_an_option_out_of_range_is_named_by_its_flag_before_anything_starts(
        tmp_path: Path, flags: list[str], said: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(tmp_path / "kb.json"), "run-campaign", str(SWISH),
         *flags], env={**os.environ, "KB_MCP_HOME": str(tmp_path / "home")},
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == f"kb-mcp run-campaign: {said}"
    assert not (tmp_path / "kb.artifacts").exists()  # nothing was started


@pytest.mark.nvcc
def test_endpoint_failure_stops_the_campaign_and_a_rerun_resumes(tmp_path: Path) -> None:
    kb, out = tmp_path / "kb.json", tmp_path / "camp"
    broken = campaign_script()
    broken.rules.insert(0, Rule(role="lower", answers=[Answer(status=503, text="model overloaded")]))
    flags = ("--compile-only", "--iterations", "1", "--steps", "2", "--gradient-every", "0")
    with FakeLLMServer(broken) as server:
        first = run_campaign_process(campaign_command(kb, out, [SWISH], *flags), campaign_env(server, tmp_path / "h"))
        assert len(server.requests_for("lower")) == 3  # one try and the two retries the environment allows
    assert first.returncode == 3, first.stdout + first.stderr  # the endpoint failed: the machine's, not the input's
    assert "campaign stopped" in first.stdout and "failed" in first.stdout and "rerun" in first.stdout
    store = CampaignStore(out)
    status = store.read_status()
    assert status.state == "stopped" and "model overloaded" in status.message
    assert store.initials()["swish"].accepted and store.steps() == []  # the failed step left no record
    with FakeLLMServer(campaign_script()) as server:
        second = run_campaign_process(campaign_command(kb, out, []), campaign_env(server, tmp_path / "h"))
        assert server.requests_for("generate") == []  # the first kernel was kept
    assert second.returncode == 0, second.stdout + second.stderr
    assert store.read_status().state == "finished" and len(store.steps()) == 2


@pytest.mark.nvcc
def test_parallel_trajectories_and_report_rebuild(tmp_path: Path) -> None:
    kb, out = tmp_path / "kb.json", tmp_path / "camp"
    with FakeLLMServer(campaign_script()) as server:
        env = campaign_env(server, tmp_path / "h")
        proc = run_campaign_process(
            campaign_command(kb, out, [SWISH], "--compile-only", "--iterations", "3", "--steps", "2",
                             "--parallel", "3", "--gradient-every", "0"),
            env,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert len(server.requests_for("generate", "swish")) == 3  # generated once, not once per trajectory
    store = CampaignStore(out)
    steps = store.steps()
    assert sorted((s.iteration, s.step) for s in steps) == [(i, j) for i in range(3) for j in range(2)]
    for i in range(3):
        first, second = [s for s in steps if s.iteration == i]
        assert second.parent_candidate_id == (first.candidate_id if first.accepted else first.parent_candidate_id)
    report = json.loads((store.report_dir / "report.json").read_text())
    for path in store.report_dir.iterdir():
        path.unlink()
    rebuilt = subprocess.run(
        [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb), "run-campaign", "--out", str(out), "--report"],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert json.loads((store.report_dir / "report.json").read_text()) == report
    assert (store.report_dir / "fast_p.png").exists()


def test_progress_bars_and_plain_lines(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    from kb_mcp.server.campaign_console import ConsoleProgress

    plain = ConsoleProgress(enabled=False)
    with plain:
        plain.update("swish", 2, 5, "i0 s0 vectorize: faster 1.40x, accepted")
    assert "[swish] 2/5 i0 s0 vectorize: faster 1.40x, accepted" in capsys.readouterr().err

    bars = ConsoleProgress(enabled=True)
    bars.console = Console(stderr=True, force_terminal=True, width=140, record=True)
    bars.bars = True
    with bars:
        bars.update("swish", 2, 5, "queued")
        bars.update("elementwise_chain_small", 1, 5, "first kernel: faster")
        bars.log("a line above the bars")
    text = bars.console.export_text()
    assert "swish" in text and "elementwise_chain_small" in text and "3/10" in text and "a line above the bars" in text


def test_an_evals_eta_is_the_overall_bars_message(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    from kb_mcp.campaign.eta import OVERALL
    from kb_mcp.server.campaign_console import ConsoleProgress

    plain = ConsoleProgress(enabled=False)
    with plain:
        plain.update(OVERALL, 0, 4, "ETA unknown (no problem finished yet)")
        plain.update(OVERALL, 0, 4, "ETA unknown (no problem finished yet) · 1/4 built ahead")  # same count: quiet
        plain.update(OVERALL, 1, 4, "ETA about 3 min 00 s (from the first problem, cold start included)")
    err = capsys.readouterr().err
    assert err.count("[all problems]") == 2 and "[all problems] 1/4 verified; ETA about 3 min 00 s" in err
    assert "[*]" not in err  # never a problem's bar of its own

    bars = ConsoleProgress(enabled=True)
    bars.console = Console(stderr=True, force_terminal=True, width=160, record=True)
    bars.bars = True
    with bars:
        bars.update("12_Gemm", 0, 1, "timing ModelNew.forward")
        bars.update(OVERALL, 2, 10, "ETA 4 min 10 s · 7/8 built ahead")
    text = bars.console.export_text()
    assert "ETA 4 min 10 s · 7/8 built ahead" in text and "12_Gemm" in text and "*" not in text.split("all problems")[0]


@pytest.mark.parametrize("name", ["..", "."])
def test_a_campaign_name_that_leaves_the_campaigns_folder_is_refused(tmp_path: Path, name: str) -> None:
    env = {**os.environ, "KB_MCP_LLM_MODEL": "x", "KB_MCP_LLM_BASE_URL": "http://127.0.0.1:9/v1",
           "KB_MCP_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(tmp_path / "kb.json"), "run-campaign", str(SWISH),
         "--name", name, "--compile-only", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert "cannot name a campaign" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "kb.artifacts" / "campaign.json").exists()
    assert not (tmp_path / "campaign.json").exists()
