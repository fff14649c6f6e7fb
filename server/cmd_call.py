"""`kb-mcp call TOOL --json '{...}' --arg key=value`: any tool from a shell, its result as JSON.

By default the tool runs in this process, through the same MCP server `kb-mcp serve` builds,
reached with the SDK's in-memory client: same validation, error messages and result shape as
an agent gets, without spawning anything. `--url` calls a running `kb-mcp serve --http` instead
(a team's shared server, or one that should keep a job running after this command exits).

The result (structured content) goes to stdout as JSON; errors and progress go to stderr.
Exit status: 0 success, 1 the caller's mistake (the tool refused the arguments, or the call ran
past --timeout), 2 bad command line or unknown tool, 3 the environment's fault (KB file, disk, lock,
permissions: the message says what to do), 4 a kb-mcp bug (the traceback is in the log).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kb_mcp.kb.errors import KbMcpError, decode_utf8, input_error
from kb_mcp.server import exit_status, logs
from kb_mcp.server.token import add_token_arguments, read_token

if TYPE_CHECKING:  # the MCP SDK is imported when `call` runs (it takes a second to import)
    from mcp import Client

log = logging.getLogger(__name__)


class UsageError(ValueError):
    """A command line that cannot be turned into a call."""


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the `call` command."""
    p = sub.add_parser(
        "call",
        help="call one tool and print its JSON result",
        description=__doc__.split("\n\n")[0] + " Values of --arg are parsed as JSON when they parse "
        "(numbers, true, lists), else taken as text; KEY=@FILE reads a file (e.g. a candidate's source).",
        epilog="examples:\n"
        "  kb-mcp call --list\n"
        "  kb-mcp call suggest_optimizations --arg state_id=memory_bandwidth_saturated --arg k=3\n"
        "  kb-mcp call compile_and_verify --arg problem=examples/problems/swish.py --arg candidate=@swish_new.py\n"
        "  kb-mcp call start_job --json '{\"kind\": \"profile_kernel\", \"arguments\": {\"problem\": \"p.py\"}}'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("tool", nargs="?", help="tool name (see --list)")
    p.add_argument("--list", action="store_true", help="list the tools with their arguments and exit")
    p.add_argument("--json", metavar="JSON",
                   help="arguments as a JSON object; @FILE reads it from a file, - from stdin")
    p.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE", help="one argument; repeatable")
    p.add_argument("--url", help="call a running `kb-mcp serve --http` server at this URL (…/mcp)")
    add_token_arguments(p, "the bearer token for --url")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="give up after S seconds (exit status 1; `start_job` runs a long call in the background)")
    p.add_argument("--log-level", default="WARNING", choices=logs.LEVELS, help="stderr log level (default WARNING)")
    p.set_defaults(func=run)


def _read_source(text: str) -> str:
    if text == "-":
        return sys.stdin.read()
    if text.startswith("@"):
        path = Path(text[1:]).expanduser()
        try:
            data = path.read_bytes()
        except OSError as exc:  # no such file: the caller's; permissions, a failing disk: the machine's
            raise input_error(exc, "the file", path) from exc
        return decode_utf8(data, path)  # names the file and the byte, as for every input file
    return text


def parse_value(text: str) -> Any:
    """An --arg value: @FILE's text, else JSON if it parses as JSON, else the text itself."""
    if text.startswith("@"):
        return _read_source(text)
    try:
        return json.loads(text)
    except ValueError:
        return text


def build_arguments(json_text: str | None, pairs: list[str]) -> dict[str, Any]:
    """Merges --json and --arg (later --arg wins) into the tool's arguments."""
    arguments: dict[str, Any] = {}
    if json_text:
        try:
            loaded = json.loads(_read_source(json_text))
        except ValueError as exc:
            raise UsageError(f"--json is not valid JSON: {exc}") from exc
        if not isinstance(loaded, dict):
            raise UsageError("--json must be a JSON object of argument names to values")
        arguments.update(loaded)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--arg wants KEY=VALUE, got {pair!r}")
        arguments[key.strip()] = parse_value(value)
    return arguments


def describe_tool(name: str, description: str | None, schema: dict[str, Any] | None) -> str:
    """`name(arg*, arg=default, ...)` plus the first sentence of the description."""
    schema = schema or {}
    required = set(schema.get("required", []))
    params = []
    for arg, prop in (schema.get("properties") or {}).items():
        if arg in required:
            params.append(f"{arg}*")
        elif "default" in prop:
            params.append(f"{arg}={json.dumps(prop['default'])}")
        else:
            params.append(arg)
    first = " ".join((description or "").split()).split(". ")[0].rstrip(".")
    return f"{name}({', '.join(params)})\n    {first}."


def _listing(lines: list[str]) -> str:
    return "\n".join([*lines, "(* = required; `kb-mcp call TOOL --arg KEY=VALUE` calls one)"])


def list_declared_tools(args: argparse.Namespace) -> None:
    """Lists the tools an in-process server would serve, from the tools' own declarations: the
    same specs and schemas `build_server` registers, without importing the MCP SDK or opening
    the KB (a listing should not take seconds)."""
    from kb_mcp.server.job_tools import server_specs
    from kb_mcp.tools.context import ToolContext

    _jobs, specs = server_specs(ToolContext(args.kb, client_name="cli", standby_profiler=False))
    print(_listing([describe_tool(s.name, s.description, s.input_schema()) for s in specs]))


@asynccontextmanager
async def _connect(args: argparse.Namespace) -> AsyncIterator[tuple[Client, Any]]:
    from mcp import Client

    from kb_mcp.clients.mcp_client import connect_http

    if args.url:
        async with connect_http(args.url, read_token(args), timeout_s=args.timeout) as c:
            yield c, None
        return
    from kb_mcp.server.app import build_server
    from kb_mcp.tools.context import ToolContext

    server = build_server(ToolContext(args.kb, client_name="cli", standby_profiler=False))
    async with Client(server, read_timeout_seconds=args.timeout) as client:
        yield client, server


async def _progress(progress: float, total: float | None, message: str | None) -> None:
    pct = f"{100.0 * progress / total:5.1f}%" if total else f"{progress:g}"
    print(f"[{pct}] {message or ''}".rstrip(), file=sys.stderr, flush=True)


async def _call(args: argparse.Namespace, arguments: dict[str, Any]) -> tuple[int, Any, str | None]:
    """(exit status, the in-process server or None, what to print on stdout): stdout is written by
    the caller, outside the SDK's task groups, so a closed stdout is an error of its own."""
    from kb_mcp.clients.mcp_client import ToolCallError, result_json

    async with _connect(args) as (client, server):
        listed = (await client.list_tools()).tools
        if args.list:  # a remote server's own listing (an in-process one is listed from declarations)
            described = [describe_tool(t.name, t.description, t.input_schema) for t in listed]
            return exit_status.OK, server, _listing(described)
        names = [t.name for t in listed]
        if args.tool not in names:
            print(f"kb-mcp call: no tool {args.tool!r}; tools: {', '.join(names)}", file=sys.stderr)
            return exit_status.USAGE, server, None
        result = await client.call_tool(args.tool, arguments, progress_callback=_progress)
        try:
            payload = result_json(args.tool, result)
        except ToolCallError as exc:
            # the SDK prefixes every tool error with this; the command line already names the tool
            message = exc.message.removeprefix(f"Error executing tool {args.tool}: ")
            print(f"kb-mcp call {args.tool}: {message}", file=sys.stderr)
            return exit_status.of(exc), server, None
        return exit_status.OK, server, json.dumps(payload, indent=2)


def run(args: argparse.Namespace) -> int:
    """Runs the call; returns the exit status."""
    logs.configure(args.log_level)
    if not args.list and not args.tool:
        print("kb-mcp call: name a tool (or --list to see them)", file=sys.stderr)
        return exit_status.USAGE
    try:
        arguments = build_arguments(args.json, args.arg)
        read_token(args)  # refuses --token, an unreadable token file, before anything starts
    except (UsageError, ValueError) as exc:
        print(f"kb-mcp call: {exc}", file=sys.stderr)
        return exit_status.USAGE
    except KbMcpError as exc:  # a file named by --arg KEY=@FILE or --token-file that cannot be read
        print(f"kb-mcp call: {exc}", file=sys.stderr)
        return exit_status.of(exc)
    if args.list and not args.url:
        list_declared_tools(args)
        return exit_status.OK
    import anyio

    server = None
    try:
        code, server, output = anyio.run(_call, args, arguments)
    except KbMcpError as exc:  # e.g. the KB could not be opened while building the server
        print(f"kb-mcp call: {exc}", file=sys.stderr)
        return exit_status.of(exc)
    except Exception as exc:  # the SDK's client raises task-group errors that say little
        if timed_out(exc):
            print(f"kb-mcp call: {timeout_message(args)}", file=sys.stderr)
            return exit_status.CALLER
        if not args.url:
            raise
        from kb_mcp.clients.mcp_client import explain_http_failure

        reason = explain_http_failure(args.url, read_token(args))
        print(f"kb-mcp call: {reason}", file=sys.stderr)
        log.debug("connection failure", exc_info=exc)
        return exit_status.USAGE  # most often a wrong --url or token (docs/agents.md, "Exit statuses")
    else:
        if output is not None:
            print(output)
    finally:
        if server is not None:
            _wait_for_jobs(server)
    return code


def timed_out(exc: BaseException) -> bool:
    """True when `exc` (or an exception inside the task groups that wrap it) is the SDK giving up on
    a request after --timeout: the MCP error REQUEST_TIMEOUT, in process or over HTTP."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import REQUEST_TIMEOUT

    inner = getattr(exc, "exceptions", None)  # an exception group (its backport on Python 3.10)
    if isinstance(inner, tuple):
        return any(timed_out(e) for e in inner)
    return isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT


def timeout_message(args: argparse.Namespace) -> str:
    """What a call that ran out of its --timeout says: the caller's to fix, and how."""
    what = f"{args.tool} did not answer" if args.tool else "the server did not answer"
    within = f"within --timeout {args.timeout:g} s" if args.timeout is not None else "in the time allowed"
    return (f"{what} {within}: the call was given too little time (the tool did not fail). Call again with a "
            "larger --timeout (or none), or run it in the background with `start_job` and read it back with "
            "`job_status`")


def _wait_for_jobs(server: Any) -> None:
    """In-process jobs die with this process: wait for them, saying so, then stop workers."""
    mine = [r for r in server.jobs.store.list() if not r.finished and r.owner.endswith(f":{os.getpid()}")]
    if mine:
        ids = ", ".join(r.job_id for r in mine)
        print(
            f"kb-mcp call: job(s) {ids} run in this process; waiting for them to finish "
            "(serve with --http and call with --url to leave jobs running in a server)",
            file=sys.stderr,
        )
    try:
        server.jobs.shutdown(wait=True)
    except KeyboardInterrupt:
        print("kb-mcp call: abandoned the job(s); they will read as interrupted", file=sys.stderr)
        server.kb_ctx.close()
        os._exit(exit_status.INTERRUPTED)  # job threads are not daemons: a normal exit would wait for them again
    server.kb_ctx.close()
