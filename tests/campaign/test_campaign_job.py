"""The campaign started from MCP as a job: start_job -> job_status -> result, through a real MCP
client on the real server, with the scripted LLM endpoint and real nvcc (compile-only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from campaign_helpers import ROOT, SWISH, slow_campaign_script
from fakellm import FakeLLMServer
from fakellm.campaign_script import campaign_script
from mcp import Client

from kb_mcp.clients.mcp_client import ToolCallError, call_json
from kb_mcp.server.app import build_server
from kb_mcp.tools.context import ToolContext
from kb_mcp.tools.source import FileAccess


async def _run_job(kb: Path, arguments: dict, timeout_s: float = 400, files: FileAccess | None = None,
                   client: str = "") -> dict:
    server = build_server(ToolContext(kb, files=files, client_name=client))
    try:
        async with Client(server) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert "start_job" in tools
            started = await call_json(client, "start_job", {"kind": "run_campaign", "arguments": arguments})
            assert started["status"] in ("queued", "running")
            status = started
            deadline = time.monotonic() + timeout_s
            while status["status"] in ("queued", "running") and time.monotonic() < deadline:
                status = await call_json(client, "job_status",
                                         {"job_id": started["job_id"], "job_key": started["job_key"], "wait_s": 10})
            return status
    finally:
        server.jobs.shutdown(wait=True)
        server.kb_ctx.close()


@pytest.mark.nvcc
async def test_campaign_job_runs_to_a_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kb = tmp_path / "kb.json"
    with FakeLLMServer(campaign_script()) as llm:
        monkeypatch.setenv("KB_MCP_LLM_BASE_URL", llm.base_url)
        monkeypatch.setenv("KB_MCP_LLM_MODEL", "fake-model")
        status = await _run_job(kb, {
            "problems": [str(SWISH)], "name": "from-mcp", "compile_only": True,
            "iterations": 1, "steps": 2, "gradient_every": 0,
        })
        assert {r.role for r in llm.requests} >= {"generate", "lower", "review"}
    assert status["status"] == "succeeded", status
    result = status["result"]
    assert result["finished"] and result["problems"] == 1 and result["valid_rate"] == 0.0
    folder = Path(result["folder"])
    assert folder == tmp_path / "kb.artifacts" / "campaigns" / "from-mcp"
    report = json.loads(Path(result["report_json"]).read_text())
    assert report["mode"] == "compile-only" and len(report["problems"]) == 1
    assert "textual gradient off" in " ".join(report["notes"])
    assert [Path(p).name for p in result["best_kernels"]] == ["swish.py"]
    stored = json.loads((folder / "campaign.json").read_text())
    assert "api_key" not in json.dumps(stored)


async def test_campaign_job_without_llm_fails_with_instructions(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("KB_MCP_LLM_BASE_URL", "KB_MCP_LLM_MODEL", "KB_MCP_LLM_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    status = await _run_job(tmp_path / "kb.json", {"problems": [str(SWISH)], "compile_only": True})
    assert status["status"] == "failed"
    assert "KB_MCP_LLM_MODEL" in status["error"] and "--llm-base-url" in status["error"]
    assert status["error_info"]["whose"] == "environment"  # the operator's setting, no argument of the caller's
    # with the operator's endpoint set, only the model is missing: the caller can name one
    monkeypatch.setenv("KB_MCP_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    status = await _run_job(tmp_path / "kb.json", {"problems": [str(SWISH)], "compile_only": True})
    assert status["status"] == "failed" and status["error_info"]["whose"] == "caller", status


async def test_a_campaign_another_run_holds_is_refused_as_the_machines_not_the_callers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kb_mcp.campaign.names import campaign_folder

    kb = tmp_path / "kb.json"
    folder = campaign_folder(kb, "held")
    folder.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from filelock import FileLock; lock = FileLock(sys.argv[1]); lock.acquire(); "
        "print('held', flush=True); time.sleep(120)"), str(folder / ".campaign.lock")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with FakeLLMServer(campaign_script()) as llm:
            monkeypatch.setenv("KB_MCP_LLM_BASE_URL", llm.base_url)
            monkeypatch.setenv("KB_MCP_LLM_MODEL", "fake-model")
            status = await _run_job(kb, {**ONE_STEP, "name": "held"})
        assert status["status"] == "failed" and "in progress" in status["error"], status
        assert status["error_info"]["whose"] == "environment"
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.nvcc
async def test_cancelled_campaign_job_stops_cleanly_and_resumes(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import anyio

    from kb_mcp.campaign.store import CampaignStore

    kb = tmp_path / "kb.json"
    script = slow_campaign_script(0.5)  # steps in flight long enough to cancel between them
    arguments = {"problems": [str(SWISH)], "name": "cancel-me", "compile_only": True, "iterations": 1, "steps": 4,
                 "gradient_every": 0}
    folder = tmp_path / "kb.artifacts" / "campaigns" / "cancel-me"
    with FakeLLMServer(script) as llm:
        monkeypatch.setenv("KB_MCP_LLM_BASE_URL", llm.base_url)
        monkeypatch.setenv("KB_MCP_LLM_MODEL", "fake-model")
        server = build_server(ToolContext(kb))
        try:
            async with Client(server) as client:
                job = await call_json(client, "start_job", {"kind": "run_campaign", "arguments": arguments})
                deadline = time.monotonic() + 300
                while not list((folder / "raw" / "steps").glob("*/*.json")) and time.monotonic() < deadline:
                    await anyio.sleep(0.05)
                await call_json(client, "cancel_job", {"job_id": job["job_id"], "job_key": job["job_key"]})
                status = await call_json(client, "job_status", {"job_id": job["job_id"], "wait_s": 60})
                assert status["status"] == "cancelled", status
                stopped = CampaignStore(folder)
                assert stopped.read_status().state == "stopped"
                done_before = len(stopped.steps())
                assert 1 <= done_before < 4
        finally:
            server.jobs.shutdown(wait=True)
            server.kb_ctx.close()
        status = await _run_job(kb, arguments)  # the same name again: resumes
    assert status["status"] == "succeeded", status
    store = CampaignStore(folder)
    assert store.read_status().runs == 2 and [s.step for s in store.steps()] == [0, 1, 2, 3]


async def test_a_client_cannot_send_the_campaign_and_the_servers_key_to_another_endpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kb = tmp_path / "kb.json"
    monkeypatch.setenv("KB_MCP_LLM_API_KEY", "sk-the-operators-key-0123456789")
    monkeypatch.setenv("KB_MCP_LLM_MODEL", "fake-model")
    monkeypatch.setenv("KB_MCP_LLM_BASE_URL", "http://127.0.0.1:9/v1")  # the operator's endpoint
    arguments = {"problems": [str(SWISH)], "name": "elsewhere", "compile_only": True, "iterations": 1, "steps": 1}
    with FakeLLMServer(campaign_script()) as chosen_by_the_client:
        server = build_server(ToolContext(kb))
        try:
            async with Client(server) as client:
                with pytest.raises(ToolCallError) as refused:
                    await call_json(client, "start_job", {"kind": "run_campaign", "arguments": {
                        **arguments, "base_url": chosen_by_the_client.base_url}})
        finally:
            server.jobs.shutdown(wait=True)
            server.kb_ctx.close()
        assert chosen_by_the_client.requests == []
    message = str(refused.value)
    assert "base_url" in message and "KB_MCP_LLM_BASE_URL" in message and "operator" in message
    assert not list((tmp_path / "kb.artifacts" / "jobs").glob("j_*.json"))  # refused at the start: no job


def test_the_operators_own_endpoint_may_be_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from kb_mcp.campaign.job import Request

    monkeypatch.setenv("KB_MCP_LLM_BASE_URL", "http://llm.example/v1/")
    assert Request.model_validate({"base_url": "http://llm.example/v1"}).base_url == "http://llm.example/v1"
    monkeypatch.delenv("KB_MCP_LLM_BASE_URL")  # the operator's endpoint is OpenAI's default: no other
    with pytest.raises(ValueError, match="KB_MCP_LLM_BASE_URL"):
        Request.model_validate({"base_url": "http://llm.example/v1"})


@pytest.mark.parametrize("name", ["..", "."])
def test_start_job_refuses_a_campaign_name_that_leaves_the_campaigns_folder(tmp_path: Path, name: str) -> None:
    kb = tmp_path / "kb.json"
    args = {"kind": "run_campaign", "arguments": {"name": name, "problems": [str(SWISH)], "compile_only": True}}
    env = {**os.environ, "KB_MCP_LLM_MODEL": "x", "KB_MCP_LLM_BASE_URL": "http://127.0.0.1:9/v1",
           "KB_MCP_LLM_MAX_RETRIES": "0", "KB_MCP_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb), "call", "start_job",
                           "--json", json.dumps(args)], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 1 and "- name: " in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    artifacts = tmp_path / "kb.artifacts"
    assert not any((folder / "campaign.json").exists() for folder in (artifacts, tmp_path))
    assert not list((artifacts / "jobs").glob("j_*.json"))


async def test_a_campaign_reads_no_problem_file_outside_the_folders_its_server_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    allowed, outside = tmp_path / "shared", tmp_path / "private"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "swish.py").write_text(SWISH.read_text())
    (outside / "secret.py").write_text(SWISH.read_text())
    (allowed / "linked.py").symlink_to(outside / "secret.py")
    files = FileAccess.of([allowed])
    with FakeLLMServer(campaign_script()) as llm:
        monkeypatch.setenv("KB_MCP_LLM_BASE_URL", llm.base_url)
        monkeypatch.setenv("KB_MCP_LLM_MODEL", "fake-model")
        for problems in ([str(outside / "secret.py")], [str(outside)], [str(allowed)], [str(allowed / "linked.py")],
                         [str(allowed / ".." / "private" / "secret.py")]):
            status = await _run_job(tmp_path / "kb.json", {"problems": problems, "compile_only": True,
                                                           "iterations": 1, "steps": 1, "gradient_every": 0},
                                    files=files)
            assert status["status"] == "failed", (problems, status)
            assert "reads no files of its clients outside" in status["error"], status["error"]
        assert llm.requests == []  # refused before anything was asked of the LLM, or read


ONE_STEP = {"problems": [str(SWISH)], "compile_only": True, "iterations": 1, "steps": 1, "gradient_every": 0}


def _campaigns(kb: Path) -> dict[str, str | None]:
    """The campaign folders beside the KB, and the client each header names."""
    from kb_mcp.campaign.store import CampaignStore

    root = kb.parent / "kb.artifacts" / "campaigns"
    return {f.name: CampaignStore(f).read_status().client for f in root.iterdir()}


@pytest.mark.nvcc
async def test_a_client_keeps_its_newest_finished_campaigns_never_a_running_one_anothers_or_the_operators(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kb_mcp.campaign.names import campaign_folder
    from kb_mcp.campaign.store import CampaignStore

    kb = tmp_path / "kb.json"
    monkeypatch.setenv("KB_MCP_CAMPAIGNS_KEPT_PER_CLIENT", "2")
    with FakeLLMServer(campaign_script()) as llm:
        monkeypatch.setenv("KB_MCP_LLM_BASE_URL", llm.base_url)
        monkeypatch.setenv("KB_MCP_LLM_MODEL", "fake-model")
        shell = subprocess.run(  # the operator's own campaign, from the shell
            [sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb), "run-campaign", str(SWISH), "--name",
             "overnight", "--compile-only", "--iterations", "1", "--steps", "1", "--gradient-every", "0",
             "--no-progress"], env={**os.environ, "KB_MCP_HOME": str(tmp_path / "home")},
            capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert shell.returncode == 0, shell.stderr
        assert (await _run_job(kb, {**ONE_STEP, "name": "bob-1"}, client="agent:bob"))["status"] == "succeeded"
        assert (await _run_job(kb, {**ONE_STEP, "name": "a1"}, client="agent:alice"))["status"] == "succeeded"
        running = CampaignStore(campaign_folder(kb, "a1"))
        running.acquire()  # a resume of a1 in progress (another server on this KB)
        try:
            for name in ("a2", "a3", "a4"):
                status = await _run_job(kb, {**ONE_STEP, "name": name}, client="agent:alice")
                assert status["status"] == "succeeded", status
        finally:
            running.release()
    # alice's two newest finished campaigns stay, and the one being run; a2 went with everything in it
    assert _campaigns(kb) == {"overnight": None, "bob-1": "agent:bob", "a1": "agent:alice", "a3": "agent:alice",
                              "a4": "agent:alice"}
    assert CampaignStore(campaign_folder(kb, "a4")).read_status().state == "finished"


@pytest.mark.nvcc
async def test_a_client_cannot_run_a_campaign_another_client_or_the_operator_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kb_mcp.campaign.names import campaign_folder
    from kb_mcp.campaign.runner import CampaignOptions, run_campaign
    from kb_mcp.campaign.store import CampaignStore
    from kb_mcp.clients.llm import LLMConfig

    kb = tmp_path / "kb.json"
    with FakeLLMServer(campaign_script()) as llm:
        monkeypatch.setenv("KB_MCP_LLM_BASE_URL", llm.base_url)
        monkeypatch.setenv("KB_MCP_LLM_MODEL", "fake-model")
        assert (await _run_job(kb, {**ONE_STEP, "name": "mine"}, client="agent:alice"))["status"] == "succeeded"
        options = CampaignOptions.model_validate(ONE_STEP)
        run_campaign(campaign_folder(kb, "overnight"), kb, options, LLMConfig.from_env().require())  # the shell's
        asked = len(llm.requests)
        for name, who in (("mine", "another client"), ("overnight", "operator")):
            for arguments in ({"name": name}, {**ONE_STEP, "name": name, "iterations": 2}):
                status = await _run_job(kb, arguments, client="agent:bob")
                assert status["status"] == "failed", status
                assert who in status["error"] and "choose another name" in status["error"], status["error"]
                assert status["error_info"]["whose"] == "caller"
        assert len(llm.requests) == asked  # refused before the LLM was asked anything
    for name, client in (("mine", "agent:alice"), ("overnight", None)):
        header = CampaignStore(campaign_folder(kb, name)).read_status()
        assert (header.client, header.runs, header.config.iterations) == (client, 1, 1)


CAPPED_COUNTS = {"iterations": "KB_MCP_CAMPAIGN_MAX_ITERATIONS", "steps": "KB_MCP_CAMPAIGN_MAX_STEPS",
                 "fix_attempts": "KB_MCP_CAMPAIGN_MAX_ATTEMPTS", "generate_attempts": "KB_MCP_CAMPAIGN_MAX_ATTEMPTS",
                 "parallel": "KB_MCP_CAMPAIGN_MAX_PARALLEL"}


async def _refused_start(kb: Path, arguments: dict) -> str:
    """What start_job(run_campaign, arguments) on a real server over the KB says as it refuses them."""
    server = build_server(ToolContext(kb))
    try:
        async with Client(server) as client:
            with pytest.raises(ToolCallError) as refused:
                await call_json(client, "start_job", {"kind": "run_campaign", "arguments": arguments})
            return str(refused.value)
    finally:
        server.jobs.shutdown(wait=True)
        server.kb_ctx.close()


@pytest.mark.parametrize("field", sorted(CAPPED_COUNTS))
async def test_a_clients_campaign_over_a_cap_is_refused_at_start_naming_the_cap_and_its_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str) -> None:
    from kb_mcp.campaign.caps import CAPPED

    monkeypatch.setenv("KB_MCP_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("KB_MCP_LLM_MODEL", "fake-model")
    most, setting = CAPPED[field].default, CAPPED_COUNTS[field]
    message = await _refused_start(tmp_path / "kb.json", {**ONE_STEP, field: most + 1})
    assert f"{field}={most + 1}" in message and f"at most {most}" in message, message
    assert f"{setting}={most}" in message and "operator" in message and "kb-mcp run-campaign" in message
    assert "Traceback" not in message
    assert not list((tmp_path / "kb.artifacts" / "jobs").glob("j_*.json"))  # refused at the start: no job


def test_the_campaign_schema_names_each_caps_setting_and_no_fixed_maximum() -> None:
    from kb_mcp.campaign.job import Request

    fields = Request.model_json_schema()["properties"]
    for field, setting in {**CAPPED_COUNTS, "problems": "KB_MCP_CAMPAIGN_MAX_PROBLEMS"}.items():
        assert setting in fields[field]["description"], field
        assert "maximum" not in json.dumps(fields[field]), fields[field]  # the operator's cap is read per request


@pytest.mark.parametrize("field", sorted(CAPPED_COUNTS))
def test_the_operator_raises_or_lowers_a_clients_campaign_cap_with_its_setting(
        monkeypatch: pytest.MonkeyPatch, field: str) -> None:
    from pydantic import ValidationError

    from kb_mcp.campaign.job import Request

    monkeypatch.setenv(CAPPED_COUNTS[field], "1000")
    assert getattr(Request.model_validate({field: 1000}), field) == 1000
    monkeypatch.setenv(CAPPED_COUNTS[field], "2")
    assert getattr(Request.model_validate({field: 2}), field) == 2
    with pytest.raises(ValidationError, match=f"{CAPPED_COUNTS[field]}=2"):
        Request.model_validate({field: 3})


def test_the_operators_shell_campaign_is_not_capped() -> None:
    from kb_mcp.campaign.caps import CAPPED
    from kb_mcp.campaign.runner import CampaignOptions

    counts = {field: CAPPED[field].default * 10 for field in CAPPED_COUNTS}
    assert CampaignOptions.model_validate(counts).model_dump(include=set(counts)) == counts


def _problems(folder: Path, names: list[str]) -> Path:
    folder.mkdir()
    for name in names:
        (folder / f"{name}.py").write_text((SWISH.parent / f"{name}.py").read_text())
    return folder


async def test_a_campaign_selecting_more_problems_than_the_cap_is_refused_before_the_llm_is_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _problems(tmp_path / "problems", ["swish", "elementwise_chain_small", "softmax"])
    kb = tmp_path / "kb.json"
    monkeypatch.setenv("KB_MCP_CAMPAIGN_MAX_PROBLEMS", "2")
    with FakeLLMServer(campaign_script()) as llm:
        monkeypatch.setenv("KB_MCP_LLM_BASE_URL", llm.base_url)
        monkeypatch.setenv("KB_MCP_LLM_MODEL", "fake-model")
        for arguments in ({"problems": [str(folder)]}, {"problems": [str(folder), str(SWISH.parent / "gemm.py")]}):
            status = await _run_job(kb, {**ONE_STEP, **arguments, "name": "many"})
            assert status["status"] == "failed", status
            assert "problems selected: a campaign started through this server takes at most 2 problems" in \
                status["error"] and "KB_MCP_CAMPAIGN_MAX_PROBLEMS=2" in status["error"], status["error"]
            assert "`problem_ids`" in status["error"] and status["error_info"]["whose"] == "caller"
        assert llm.requests == []
    assert not (tmp_path / "kb.artifacts" / "campaigns" / "many" / "campaign.json").exists()


async def test_a_resumed_campaign_over_a_cap_the_operator_lowered_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kb_mcp.campaign.models import CampaignConfig, CampaignStatus
    from kb_mcp.campaign.names import campaign_folder
    from kb_mcp.campaign.store import CampaignStore

    kb = tmp_path / "kb.json"
    stopped = CampaignStatus(config=CampaignConfig(problems=[str(SWISH)], iterations=1, steps=5, compile_only=True),
                             kb_path=str(kb), client="", state="stopped", runs=1)
    CampaignStore(campaign_folder(kb, "mine")).write_status(stopped)  # this client's, stopped after a run
    monkeypatch.setenv("KB_MCP_CAMPAIGN_MAX_STEPS", "3")
    with FakeLLMServer(campaign_script()) as llm:
        monkeypatch.setenv("KB_MCP_LLM_BASE_URL", llm.base_url)
        monkeypatch.setenv("KB_MCP_LLM_MODEL", "fake-model")
        status = await _run_job(kb, {"name": "mine"})
        assert llm.requests == []
    assert status["status"] == "failed" and status["error_info"]["whose"] == "caller", status
    assert "steps=5" in status["error"] and "KB_MCP_CAMPAIGN_MAX_STEPS=3" in status["error"], status["error"]
    assert CampaignStore(campaign_folder(kb, "mine")).read_status().runs == 1  # not run again


@pytest.mark.nvcc
async def test_a_campaign_within_a_problem_cap_the_operator_raised_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _problems(tmp_path / "problems", ["swish", "elementwise_chain_small"])
    monkeypatch.setenv("KB_MCP_CAMPAIGN_MAX_PROBLEMS", "1")
    monkeypatch.setenv("KB_MCP_CAMPAIGN_MAX_STEPS", "1")
    with FakeLLMServer(campaign_script()) as llm:
        monkeypatch.setenv("KB_MCP_LLM_BASE_URL", llm.base_url)
        monkeypatch.setenv("KB_MCP_LLM_MODEL", "fake-model")
        refused = await _run_job(tmp_path / "kb.json", {**ONE_STEP, "problems": [str(folder)], "name": "two"})
        assert refused["status"] == "failed" and "KB_MCP_CAMPAIGN_MAX_PROBLEMS=1" in refused["error"], refused
        monkeypatch.setenv("KB_MCP_CAMPAIGN_MAX_PROBLEMS", "2")
        status = await _run_job(tmp_path / "kb.json", {**ONE_STEP, "problems": [str(folder)], "name": "two"})
    assert status["status"] == "succeeded", status
    assert status["result"]["finished"] and status["result"]["problems"] == 2
