"""Job handles: start -> id -> status -> result, persisted beside the KB, visible to other servers,
cancellable, and honest about jobs whose server died."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp import Client
from serverproc import endpoint_that_never_answers, http_server, session_client

from kb_mcp.clients.mcp_client import ToolCallError, call_json, connect_http
from kb_mcp.kb.errors import EnvironmentFault
from kb_mcp.server.app import KbMcpServer, build_server
from kb_mcp.server.execution import ToolFailure, ToolRunner, describe_failure
from kb_mcp.server.job_slots import MAX_JOBS_PER_SUBMITTER, MAX_LONG_JOBS_PER_SUBMITTER, submitted_by
from kb_mcp.server.job_store import ENV_JOBS_KEPT_PER_CLIENT, JobRecord, JobStore, new_job_id
from kb_mcp.server.jobs import JobManager, register_job_kind
from kb_mcp.server.registry import ToolSpec
from kb_mcp.tools.context import ToolContext, acting_for


def _manager(kb: Path, spec: ToolSpec) -> JobManager:
    ctx = ToolContext(kb)
    return JobManager(ToolRunner(ctx), [spec], JobStore(ctx.artifacts_dir / "jobs"))


def _wait_finished(manager: JobManager, job_id: str, timeout: float = 10.0) -> JobRecord:
    record = manager.wait(job_id, timeout)
    assert record.finished, record
    return record


def test_job_runs_to_a_stored_result(kb_path: Path, toy_spec: ToolSpec) -> None:
    manager = _manager(kb_path, toy_spec)
    started = manager.start("toy_count", {"n": 5, "label": "j"})
    assert started.status == "queued" and started.job_id.startswith("j_")
    record = _wait_finished(manager, started.job_id)
    assert record.status == "succeeded"
    assert record.result == {"label": "j", "counted": 5, "tags": [], "kb_file": "kb.json", "note": None}
    assert record.progress.done == 5 and record.progress.total == 5
    # the record is a file beside the KB: a fresh store (another process) reads the same thing
    path = kb_path.with_name("kb.artifacts") / "jobs" / f"{started.job_id}.json"
    assert JobRecord.model_validate_json(path.read_text()) == record
    manager.shutdown()


def test_bad_arguments_fail_the_start_and_leave_no_job(kb_path: Path, toy_spec: ToolSpec) -> None:
    manager = _manager(kb_path, toy_spec)
    with pytest.raises(ToolFailure, match="n: required"):
        manager.start("toy_count", {})
    with pytest.raises(ToolFailure, match="unknown job kind 'nope'; kinds: toy_count"):
        manager.start("nope", {})
    assert manager.store.list() == []
    manager.shutdown()


def test_a_failing_job_keeps_the_tools_message(kb_path: Path, toy_spec: ToolSpec) -> None:
    manager = _manager(kb_path, toy_spec)
    job = manager.start("toy_count", {"n": 2, "fail": "tool_error"})
    record = _wait_finished(manager, job.job_id)
    assert record.status == "failed" and record.result is None
    assert record.error is not None and "asked to fail" in record.error
    manager.shutdown()


def test_cancel_stops_a_running_job(kb_path: Path, toy_spec: ToolSpec) -> None:
    manager = _manager(kb_path, toy_spec)
    job = manager.start("toy_count", {"n": 200, "step_s": 0.02}, "the-key")
    deadline = time.monotonic() + 5
    while manager.status(job.job_id).status != "running" and time.monotonic() < deadline:
        time.sleep(0.02)
    manager.cancel(job.job_id, "the-key")
    record = _wait_finished(manager, job.job_id)
    assert record.status == "cancelled"
    assert record.progress.done < 200
    manager.shutdown()


def test_cancel_from_another_server_on_the_same_kb(kb_path: Path, toy_spec: ToolSpec) -> None:
    runner_side = _manager(kb_path, toy_spec)
    other_side = _manager(kb_path, toy_spec)  # its own store and threads, same files
    job = runner_side.start("toy_count", {"n": 300, "step_s": 0.02}, "the-key")
    time.sleep(0.3)
    assert other_side.status(job.job_id).status == "running"
    assert other_side.cancel(job.job_id, "the-key").cancel_requested
    record = _wait_finished(runner_side, job.job_id)
    assert record.status == "cancelled" and record.progress.done < 300
    runner_side.shutdown()
    other_side.shutdown()


def test_a_job_whose_server_died_is_reported_interrupted(kb_path: Path, toy_spec: ToolSpec) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    manager = _manager(kb_path, toy_spec)

    orphan = JobRecord(job_id=new_job_id(), kind="toy_count", status="running",
                       owner=f"{socket.gethostname()}:{dead_pid}")
    foreign = JobRecord(job_id=new_job_id(), kind="toy_count", status="running", owner="elsewhere:1")
    manager.store.write(orphan)
    manager.store.write(foreign)
    assert manager.recover() == [orphan.job_id]
    record = manager.status(orphan.job_id)
    assert record.status == "interrupted" and record.error is not None and "start it again" in record.error
    assert manager.status(foreign.job_id).status == "running"  # another host's job: not ours to judge
    manager.shutdown()


def test_a_damaged_job_record_is_the_environments_fault_and_named(kb_path: Path, toy_spec: ToolSpec) -> None:
    manager = _manager(kb_path, toy_spec)
    record = JobRecord(job_id=new_job_id(), kind="toy_count", status="succeeded")
    manager.store.write(record)
    path = manager.store.path(record.job_id)
    path.write_bytes(path.read_bytes()[:40])  # cut, as a damaged disk or a hand edit leaves it
    with pytest.raises(EnvironmentFault) as err:
        manager.status(record.job_id)
    assert err.value.where == str(path) and "damaged" in err.value.message and err.value.action
    seen = describe_failure(toy_spec, err.value)
    assert seen.whose == "environment" and str(path) in seen.message and "not in your arguments" in seen.message
    manager.shutdown()


def test_job_ids_cannot_reach_outside_the_jobs_folder(kb_path: Path, toy_spec: ToolSpec) -> None:
    manager = _manager(kb_path, toy_spec)
    for bad in ("../kb", "j_1", "/etc/passwd", "j_20261122120000_a1b2c3/../../x"):
        with pytest.raises(ToolFailure, match="not a job id"):
            manager.status(bad)
    with pytest.raises(ToolFailure, match="no job j_20261122120000_a1b2c3"):
        manager.status("j_20261122120000_a1b2c3")
    manager.shutdown()


async def test_job_tools_through_mcp(toy_server: KbMcpServer) -> None:
    progress: list[float] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(done)

    async with Client(toy_server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        kinds = (tools["start_job"].description or "").split("Kinds: ", 1)[1].split(".", 1)[0]
        assert "toy_count" in kinds.split(", ")  # registered job-only kinds (run_campaign) are listed too
        started = await call_json(client, "start_job", {"kind": "toy_count", "arguments": {"n": 10, "step_s": 0.1}})
        assert started["status"] in ("queued", "running")
        job_id = started["job_id"]
        done = await call_json(client, "job_status", {"job_id": job_id, "wait_s": 10}, progress=on_progress)
        assert done["status"] == "succeeded"
        assert done["result"]["counted"] == 10
        assert progress, "waiting on a job forwards its progress"
        listing = await client.read_resource("kb://jobs")
        assert job_id in listing.contents[0].text  # type: ignore[union-attr]
        with pytest.raises(ToolCallError, match="invalid arguments for toy_count"):
            await call_json(client, "start_job", {"kind": "toy_count", "arguments": {"n": "x"}})
        with pytest.raises(ToolCallError, match="unknown job kind"):
            await call_json(client, "start_job", {"kind": "rm -rf", "arguments": {}})


async def test_only_the_holder_of_the_job_key_can_cancel(toy_server: KbMcpServer) -> None:
    async with Client(toy_server) as client:
        started = await call_json(client, "start_job", {"kind": "toy_count", "arguments": {"n": 100, "step_s": 0.05}})
        job_id = started["job_id"]
        with pytest.raises(ToolCallError, match="job_key: required"):
            await call_json(client, "cancel_job", {"job_id": job_id})
        with pytest.raises(ToolCallError, match="only whoever started it can cancel it"):
            await call_json(client, "cancel_job", {"job_id": job_id, "job_key": "0" * 32})
        assert toy_server.jobs.store.read(job_id).cancel_requested is False  # type: ignore[union-attr]
        cancelled = await call_json(client, "cancel_job", {"job_id": job_id, "job_key": started["job_key"]})
        assert cancelled["job_id"] == job_id and cancelled["status"] in ("queued", "running", "cancelled")
        done = await call_json(client, "job_status", {"job_id": job_id, "job_key": started["job_key"], "wait_s": 10})
        assert done["status"] == "cancelled"


async def test_status_survives_the_server(kb_path: Path, toy_spec: ToolSpec) -> None:
    first = build_server(ToolContext(kb_path), tools=[toy_spec])
    async with Client(first) as client:
        job_id = (await call_json(client, "start_job", {"kind": "toy_count", "arguments": {"n": 2}}))["job_id"]
        await call_json(client, "job_status", {"job_id": job_id, "wait_s": 5})
    first.jobs.shutdown()
    second = build_server(ToolContext(kb_path), tools=[toy_spec])  # a later server on the same KB
    async with Client(second) as client:
        got = await call_json(client, "job_status", {"job_id": job_id})
    assert got["status"] == "succeeded" and got["result"]["counted"] == 2


async def test_registered_job_kinds_are_startable(kb_path: Path, toy_spec: ToolSpec) -> None:
    long_kind = register_job_kind(dataclasses.replace(toy_spec, name="toy_campaign", description="long"))
    try:
        server = build_server(ToolContext(kb_path), tools=[toy_spec])
        async with Client(server) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert "toy_campaign" not in names  # a job-only kind is not a direct tool
            job = await call_json(client, "start_job", {"kind": long_kind.name, "arguments": {"n": 3}})
            done = await call_json(client, "job_status", {"job_id": job["job_id"], "wait_s": 5})
        assert done["status"] == "succeeded" and done["kind"] == "toy_campaign"
    finally:
        from kb_mcp.server import jobs

        jobs._KINDS.pop("toy_campaign", None)


def test_job_only_kinds_are_imported_when_first_started(kb_path: Path, toy_spec: ToolSpec) -> None:
    ctx = ToolContext(kb_path)
    lazy = {"toy_count": "toy_tool", "broken_kind": "no_such_module_here", "misnamed": "toy_tool"}
    manager = JobManager(ToolRunner(ctx), [], JobStore(ctx.artifacts_dir / "jobs"), lazy_kinds=lazy)
    assert manager.kind_names == ["broken_kind", "misnamed", "toy_count"] and manager.kinds == {}
    done = _wait_finished(manager, manager.start("toy_count", {"n": 2}).job_id)
    assert done.status == "succeeded" and "toy_count" in manager.kinds
    with pytest.raises(ToolFailure, match="job kind 'broken_kind' is not available on this server"):
        manager.start("broken_kind", {})
    with pytest.raises(ToolFailure, match="defines 'toy_count' instead"):
        manager.start("misnamed", {})
    manager.shutdown()


def test_the_campaign_is_a_job_kind_of_the_real_server(kb_path: Path) -> None:
    server = build_server(ToolContext(kb_path))
    assert "run_campaign" in server.jobs.kind_names
    assert "run_campaign" in server.specs["start_job"].description
    spec = server.jobs.spec("run_campaign")  # the module named in JOB_ONLY_MODULES follows the convention
    assert spec.name == "run_campaign" and spec.request.model_fields
    server.jobs.shutdown()


TOKEN = "s3cret-token-for-tests-0123456789"
SWISH = Path(__file__).resolve().parents[2] / "examples" / "problems" / "swish.py"


def test_one_submitter_has_a_capped_number_of_unfinished_jobs(kb_path: Path, toy_spec: ToolSpec) -> None:
    manager = _manager(kb_path, toy_spec)
    slow = {"n": 500, "step_s": 0.02}
    with submitted_by("http:one"):
        mine = [manager.start("toy_count", slow, "k") for _ in range(MAX_JOBS_PER_SUBMITTER)]
        with pytest.raises(ToolFailure, match=f"MAX_JOBS_PER_SUBMITTER={MAX_JOBS_PER_SUBMITTER}.*cancel_job") as full:
            manager.start("toy_count", slow, "k")
        assert full.value.expected
    with submitted_by("http:another"):
        others = [manager.start("toy_count", {"n": 1}, "k")]  # another client is not held back
    others.append(manager.start("toy_count", {"n": 1}, "k"))  # nor the one client of a stdio server
    manager.cancel(mine[0].job_id, "k")
    _wait_finished(manager, mine[0].job_id)
    with submitted_by("http:one"):  # a finished job frees its place
        mine.append(manager.start("toy_count", {"n": 1}, "k"))
    for job in mine:
        manager.cancel(job.job_id, "k")
    assert all(_wait_finished(manager, job.job_id).status in ("succeeded", "cancelled") for job in [*mine, *others])
    manager.shutdown()


def test_one_submitter_leaves_a_long_running_slot_to_others(kb_path: Path, toy_spec: ToolSpec) -> None:
    long_spec = dataclasses.replace(toy_spec, meta=toy_spec.meta.model_copy(update={"long_running": True}))
    manager = JobManager(ToolRunner(ToolContext(kb_path)), [dataclasses.replace(long_spec, name="toy_long"), toy_spec],
                         JobStore(kb_path.with_name("kb.artifacts") / "jobs"))
    slow = {"n": 500, "step_s": 0.02}
    with submitted_by("agent:one"):
        mine = [manager.start("toy_long", slow, "k") for _ in range(MAX_LONG_JOBS_PER_SUBMITTER)]
        with pytest.raises(ToolFailure, match=f"MAX_LONG_JOBS_PER_SUBMITTER={MAX_LONG_JOBS_PER_SUBMITTER}.*"
                                              "campaigns still find one of the.*cancel_job") as full:
            manager.start("toy_long", slow, "k")
        assert full.value.expected
        mine.append(manager.start("toy_count", {"n": 1}, "k"))  # its other kinds are not held back
    with submitted_by("agent:another"):  # and another's long job runs now, not after the first one's
        theirs = manager.start("toy_long", slow, "k")
        deadline = time.monotonic() + 5
        while manager.status(theirs.job_id).status == "queued" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert manager.status(theirs.job_id).status == "running"
    for job in [*mine, theirs]:
        manager.cancel(job.job_id, "k")
    assert all(_wait_finished(manager, job.job_id).status in ("succeeded", "cancelled") for job in [*mine, theirs])
    manager.shutdown()


async def test_stalled_campaigns_of_one_client_leave_another_clients_job_a_slot(kb_path: Path) -> None:
    campaign = {"kind": "run_campaign", "arguments": {"problems": [str(SWISH)], "compile_only": True}}
    with endpoint_that_never_answers() as (url, held):
        env = {"KB_MCP_TOKEN": TOKEN, "KB_MCP_LLM_MODEL": "x", "KB_MCP_LLM_MAX_RETRIES": "0",
               "KB_MCP_LLM_BASE_URL": url, "KB_MCP_FILES": str(SWISH.parent)}  # the problem, read on the server
        with http_server(kb_path, ["--http", "127.0.0.1:0"], env=env) as server:
            async with session_client(server.url, TOKEN) as hog, session_client(server.url, TOKEN) as hog_again:
                await call_json(hog, "start_job", {**campaign, "arguments": {**campaign["arguments"], "name": "hog"}})
                with pytest.raises(ToolCallError, match="MAX_LONG_JOBS_PER_SUBMITTER"):
                    await call_json(hog, "start_job", {**campaign, "arguments": {
                        **campaign["arguments"], "name": "one-more"}})
                await call_json(hog_again, "start_job", {**campaign, "arguments": {  # another session: allowed
                    **campaign["arguments"], "name": "hog-again"}})
                deadline = time.monotonic() + 60
                while len(held) < 2 and time.monotonic() < deadline:  # the campaigns' slots are stuck
                    time.sleep(0.2)
                assert len(held) >= 2
                async with connect_http(server.url, TOKEN) as other:  # today's protocol: no session
                    job = await call_json(other, "start_job", {"kind": "suggest_optimizations", "arguments": {
                        "state_id": "memory_bandwidth_saturated"}})
                    view = await call_json(other, "job_status", {"job_id": job["job_id"], "job_key": job["job_key"],
                                                                 "wait_s": 30})
    assert view["status"] == "succeeded", view


async def test_clients_without_a_session_or_token_of_their_own_share_one_cap(kb_path: Path) -> None:
    campaign = {"kind": "run_campaign", "arguments": {"problems": [str(SWISH)], "compile_only": True}}

    def named(name: str) -> dict[str, object]:
        return {**campaign, "arguments": {**campaign["arguments"], "name": name}}  # type: ignore[dict-item]

    with endpoint_that_never_answers() as (url, _held):
        env = {"KB_MCP_TOKEN": TOKEN, "KB_MCP_LLM_MODEL": "x", "KB_MCP_LLM_MAX_RETRIES": "0",
               "KB_MCP_LLM_BASE_URL": url, "KB_MCP_FILES": str(SWISH.parent)}
        with http_server(kb_path, ["--http", "127.0.0.1:0"], env=env) as server:
            async with connect_http(server.url, TOKEN) as sessionless:  # today's protocol: no session
                await call_json(sessionless, "start_job", named("anon"))
            async with connect_http(server.url, TOKEN) as one_more:  # another client, as unnamed as the first
                with pytest.raises(ToolCallError, match="MAX_LONG_JOBS_PER_SUBMITTER.*--agents-file"):
                    await call_json(one_more, "start_job", named("anon-more"))
            async with session_client(server.url, TOKEN) as with_a_session:  # told apart: a share of its own
                await call_json(with_a_session, "start_job", named("with-a-session"))


def _records_of(jobs: Path) -> dict[str, list[str]]:
    """The job records on disk, by the client that started them (ids sorted)."""
    by_client: dict[str, list[str]] = {}
    for path in sorted(jobs.glob("j_*.json")):
        record = JobRecord.model_validate_json(path.read_text())
        by_client.setdefault(record.client, []).append(record.job_id)
    return by_client


def test_one_client_keeps_a_bounded_number_of_finished_jobs_and_never_touches_anothers(
        kb_path: Path, toy_spec: ToolSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client starting quick jobs in a loop (each record carrying ~100 KB of arguments) keeps its
    newest 3 finished records and its running job on disk; another client's records all stay."""
    monkeypatch.setenv(ENV_JOBS_KEPT_PER_CLIENT, "3")
    manager = _manager(kb_path, toy_spec)
    jobs = manager.store.root
    bulky = {"n": 1, "label": "x" * 100_000}
    with acting_for("agent:other"):
        theirs = [_wait_finished(manager, manager.start("toy_count", bulky, "k").job_id).job_id for _ in range(3)]
    with acting_for("agent:hog"):
        running = manager.start("toy_count", {"n": 500, "step_s": 0.02}, "k").job_id
        mine = [_wait_finished(manager, manager.start("toy_count", bulky, "k").job_id).job_id for _ in range(12)]
    on_disk = _records_of(jobs)
    assert on_disk["agent:hog"] == sorted([running, *mine[-3:]])  # its newest 3 finished, and the running one
    assert on_disk["agent:other"] == sorted(theirs)  # another client's records are not the hog's to push out
    hog_bytes = sum(p.stat().st_size for p in jobs.glob("j_*.json") if p.stem in on_disk["agent:hog"])
    assert hog_bytes < 3 * 210_000 + 10_000  # 3 finished of ~200 KB (the label in the arguments and the result)
    with pytest.raises(ToolFailure, match="keeps its newest 3 finished jobs.*start the job again") as gone:
        manager.status(mine[0])
    assert gone.value.expected
    manager.cancel(running, "k")
    _wait_finished(manager, running)
    manager.shutdown()
    assert _records_of(jobs)["agent:hog"] == sorted([*mine[-2:], running])  # it finished last: the oldest went

    monkeypatch.setenv(ENV_JOBS_KEPT_PER_CLIENT, "2")  # a server started later keeps its own bound
    again = _manager(kb_path, toy_spec)
    again.recover()
    assert _records_of(jobs) == {"agent:hog": sorted([mine[-1], running]), "agent:other": sorted(theirs[-2:])}
    again.shutdown()


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_a_bad_bound_on_kept_jobs_is_refused_by_name(kb_path: Path, value: str) -> None:
    done = subprocess.run([sys.executable, "-m", "kb_mcp.server.cli", "--kb", str(kb_path), "call", "--list"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, ENV_JOBS_KEPT_PER_CLIENT: value})
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert f"${ENV_JOBS_KEPT_PER_CLIENT}={value!r} is not a whole number, more than 0" in done.stderr


async def test_an_agent_starting_jobs_in_a_loop_keeps_only_its_newest_on_a_real_server(
        kb_path: Path, tmp_path: Path) -> None:
    """Over a spawned HTTP server with an agents file: alice's finished job records stay at the bound
    whatever she starts, bob's job record stays, and alice's oldest job is answered in words."""
    alice, bob = "alice-token-for-tests-0123456789", "bob-token-for-tests-01234567890ab"
    agents = tmp_path / "agents"
    agents.write_text(f"alice {alice}\nbob {bob}\n")
    agents.chmod(0o600)
    quick = {"kind": "suggest_optimizations", "arguments": {"state_id": "memory_bandwidth_saturated"}}
    env = {ENV_JOBS_KEPT_PER_CLIENT: "2", "KB_MCP_TOKEN": ""}
    with http_server(kb_path, ["--http", "127.0.0.1:0", "--agents-file", str(agents)], env=env) as server:
        async with connect_http(server.url, bob) as as_bob, connect_http(server.url, alice) as as_alice:
            bobs = await call_json(as_bob, "start_job", quick)
            assert (await call_json(as_bob, "job_status", {"job_id": bobs["job_id"], "wait_s": 30}))["status"] \
                == "succeeded"
            started = []
            for _ in range(6):
                job = await call_json(as_alice, "start_job", quick)
                view = await call_json(as_alice, "job_status", {"job_id": job["job_id"], "wait_s": 30})
                assert view["status"] == "succeeded", view
                started.append(job["job_id"])
            on_disk = _records_of(kb_path.with_name("kb.artifacts") / "jobs")
            with pytest.raises(ToolCallError, match="keeps its newest 2 finished jobs"):
                await call_json(as_alice, "job_status", {"job_id": started[0]})
    assert on_disk == {"agent:bob": [bobs["job_id"]], "agent:alice": sorted(started[-2:])}
