"""The tool machinery through the SDK's in-memory client, on a toy tool module: schemas from the
module's models, flattened arguments, compact results, errors as `isError`, progress, cancellation,
and the GPU lane."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import anyio
import pytest
import toy_tool
from mcp import Client

from kb_mcp.clients.mcp_client import ToolCallError, call_json
from kb_mcp.server.app import KbMcpServer, build_server
from kb_mcp.server.registry import ToolSpec
from kb_mcp.tools.base import ToolMeta, on_gpu_lane
from kb_mcp.tools.context import ToolContext


async def test_schemas_come_from_the_module_models(toy_server: KbMcpServer) -> None:
    async with Client(toy_server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"toy_count", "start_job", "job_status", "cancel_job"}
    toy = tools["toy_count"]
    expected_in = toy_tool.Request.model_json_schema()
    # flattened: the Request's fields are the tool's top-level arguments, not a nested object
    assert toy.input_schema["properties"] == expected_in["properties"]
    assert toy.input_schema["required"] == ["n"]
    assert toy.input_schema["additionalProperties"] is False
    assert toy.output_schema is not None
    assert toy.output_schema["properties"] == toy_tool.Result.model_json_schema()["properties"]
    assert toy.description == toy_tool.DESCRIPTION


async def test_success_returns_structured_and_compact_text(toy_server: KbMcpServer) -> None:
    async with Client(toy_server) as client:
        result = await client.call_tool("toy_count", {"n": 3, "label": "x"})
    assert not result.is_error
    assert result.structured_content == {
        "label": "x",
        "counted": 3,
        "tags": [],
        "kb_file": "kb.json",
        "note": None,
    }
    text = result.content[0].text  # type: ignore[union-attr]
    assert "\n" not in text and "note" not in text  # one line, nulls left out
    assert json.loads(text) == {"label": "x", "counted": 3, "tags": [], "kb_file": "kb.json"}


async def test_list_given_as_json_text_is_accepted(toy_server: KbMcpServer) -> None:
    async with Client(toy_server) as client:
        got = await call_json(client, "toy_count", {"n": 1, "tags": '["a", "b"]'})
    assert got["tags"] == ["a", "b"]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, ["- n: required, but not given"]),
        ({"n": 0}, ["- n: Input should be greater than or equal to 1 (got 0)"]),
        ({"n": "many"}, ["- n: Input should be a valid integer", "(got 'many')"]),
        ({"n": 2, "speedup": 9.9}, ["- speedup: unknown argument (accepted: fail, label, n, step_s, tags)"]),
        ({"n": 2, "fail": "sometimes"}, ["- fail: Input should be 'none', 'tool_error' or 'crash'"]),
    ],
)
async def test_bad_arguments_are_an_error_result_naming_the_field(
    toy_server: KbMcpServer, arguments: dict, expected: list[str]
) -> None:
    async with Client(toy_server) as client:
        result = await client.call_tool("toy_count", arguments)
        assert result.is_error
        text = result.content[0].text  # type: ignore[union-attr]
        for fragment in expected:
            assert fragment in text
        assert "invalid arguments for toy_count" in text
        assert "errors.pydantic.dev" not in text  # no pydantic boilerplate in the agent's context
        # the server is still serving
        assert (await call_json(client, "toy_count", {"n": 1}))["counted"] == 1


async def test_long_values_are_not_echoed_back_whole(toy_server: KbMcpServer) -> None:
    source = "x" * 5000
    async with Client(toy_server) as client:
        result = await client.call_tool("toy_count", {"n": source})
    text = result.content[0].text  # type: ignore[union-attr]
    assert result.is_error and len(text) < 600


async def test_tool_error_message_reaches_the_agent(toy_server: KbMcpServer) -> None:
    async with Client(toy_server) as client:
        with pytest.raises(ToolCallError) as err:
            await call_json(client, "toy_count", {"n": 2, "label": "mine", "fail": "tool_error"})
        assert "cannot count for 'mine': asked to fail; call again with fail='none'" in err.value.message
        assert (await call_json(client, "toy_count", {"n": 2}))["counted"] == 2


async def test_a_crash_is_an_error_result_and_the_server_lives(toy_server: KbMcpServer) -> None:
    async with Client(toy_server) as client:
        with pytest.raises(ToolCallError) as err:
            await call_json(client, "toy_count", {"n": 4, "fail": "crash"})
        assert "toy_count failed because of a bug in kb-mcp" in err.value.message
        assert "ZeroDivisionError" in err.value.message and "server log" in err.value.message
        assert err.value.whose == "kb-mcp" and err.value.error["incident"] in err.value.message
        assert (await call_json(client, "toy_count", {"n": 4}))["counted"] == 4


async def test_unknown_tool_is_an_error_result(toy_server: KbMcpServer) -> None:
    async with Client(toy_server) as client:
        result = await client.call_tool("no_such_tool", {})
        assert result.is_error and "no_such_tool" in result.content[0].text  # type: ignore[union-attr]


async def test_progress_is_forwarded_increasing_and_ends_at_total(toy_server: KbMcpServer) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async with Client(toy_server) as client:
        await client.call_tool("toy_count", {"n": 8, "step_s": 0.12}, progress_callback=on_progress)
    assert len(seen) >= 4  # throttled to a few per second, but not swallowed
    values = [done for done, _, _ in seen]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert seen[-1] == (8.0, 8.0, "counted 8 of 8")


async def test_progress_over_the_legacy_transport(toy_server: KbMcpServer) -> None:
    seen: list[float] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        seen.append(done)

    async with Client(toy_server, mode="legacy") as client:
        await client.call_tool("toy_count", {"n": 3, "step_s": 0.15}, progress_callback=on_progress)
    assert seen and seen[-1] == 3.0


async def test_a_cancelled_call_stops_the_tool_at_its_next_progress_report(tmp_path: Path, toy_spec: ToolSpec) -> None:
    steps: list[int] = []

    def counting_run(ctx, req, progress):  # type: ignore[no-untyped-def]
        def spy(done, total=None, message=None):  # type: ignore[no-untyped-def]
            steps.append(int(done))
            progress(done, total, message)

        return toy_tool.run(ctx, req, spy)

    spec = dataclasses.replace(toy_spec, run=counting_run)
    server = build_server(ToolContext(tmp_path / "kb.json"), tools=[spec])
    async with Client(server) as client:
        with anyio.move_on_after(0.3):
            await client.call_tool("toy_count", {"n": 20, "step_s": 0.05})
        await anyio.sleep(1.2)  # longer than the whole count would take
    assert 0 < len(steps) < 20


async def test_gpu_tools_take_turns(tmp_path: Path, toy_spec: ToolSpec) -> None:
    on_lane = dataclasses.replace(
        toy_spec, run=on_gpu_lane("toy_count")(toy_tool.run), meta=ToolMeta(title="toy", uses_gpu=True)
    )
    server = build_server(ToolContext(tmp_path / "kb.json"), tools=[on_lane])
    messages: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    async with Client(server) as client:
        results: list[dict] = []

        async def one(label: str) -> None:
            results.append(
                await call_json(client, "toy_count", {"n": 6, "step_s": 0.05, "label": label}, progress=on_progress)
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "a")
            tg.start_soon(one, "b")
    assert sorted(r["label"] for r in results) == ["a", "b"]
    assert any(m.startswith("waiting for the GPU") for m in messages)


async def test_prompt_walks_through_the_round(toy_server: KbMcpServer) -> None:
    async with Client(toy_server) as client:
        prompts = (await client.list_prompts()).prompts
        assert [p.name for p in prompts] == ["optimization_round"]
        args = {a.name: a for a in prompts[0].arguments or []}
        assert args["problem"].required and not args["candidate"].required
        assert args["problem"].description
        got = await client.get_prompt("optimization_round", {"problem": "examples/problems/relu.py"})
    text = got.messages[0].content.text  # type: ignore[union-attr]
    order = ["profile_kernel", "classify_state", "suggest_optimizations", "compile_and_verify", "record_outcome"]
    positions = [text.index(name) for name in order]
    assert positions == sorted(positions)
    assert "examples/problems/relu.py" in text and "ModelNew" in text and "candidate_id" in text


async def test_progress_from_a_thread_the_tool_started(tmp_path: Path, toy_spec: ToolSpec) -> None:
    import threading

    def threaded_run(ctx, req, progress):  # type: ignore[no-untyped-def]
        worker = threading.Thread(target=lambda: [progress(i + 1, req.n, f"side {i + 1}") for i in range(req.n)])
        worker.start()
        worker.join()
        return toy_tool.Result(label="threads", counted=req.n, tags=[], kb_file="-")

    spec = dataclasses.replace(toy_spec, run=threaded_run)
    server = build_server(ToolContext(tmp_path / "kb.json"), tools=[spec])
    seen: list[str | None] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        seen.append(message)

    async with Client(server) as client:
        got = await call_json(client, "toy_count", {"n": 3}, progress=on_progress)
    assert got["label"] == "threads"
    assert seen and seen[-1] == "side 3"


def test_tool_modules_declare_their_metadata() -> None:
    from kb_mcp.server.registry import load_tools

    specs = {spec.name: spec for spec in load_tools(strict=True)}
    assert all(spec.meta.title and spec.meta.title != name for name, spec in specs.items())
    assert {name for name, spec in specs.items() if spec.uses_gpu} == {"profile_kernel", "compile_and_verify",
                                                                       "decompose_problem"}
    assert {name for name, spec in specs.items() if spec.meta.read_only} == {"suggest_optimizations"}
    assert not any(spec.meta.destructive for spec in specs.values())


def test_a_gpu_flag_without_the_lane_is_refused() -> None:
    import types

    from kb_mcp.server.registry import ToolModuleError

    module = types.ModuleType("fake_gpu_tool")
    for attr in ("NAME", "DESCRIPTION", "Request", "Result", "run"):
        setattr(module, attr, getattr(toy_tool, attr))
    module.META = ToolMeta(title="fake", uses_gpu=True)  # type: ignore[attr-defined]
    with pytest.raises(ToolModuleError, match="not decorated with kb_mcp.tools.base.on_gpu_lane"):
        ToolSpec.from_module(module)
    module.META = ToolMeta(title="fake")  # type: ignore[attr-defined]
    module.run = on_gpu_lane("toy_count")(toy_tool.run)  # type: ignore[attr-defined]
    with pytest.raises(ToolModuleError, match="uses_gpu is False but run is decorated"):
        ToolSpec.from_module(module)
