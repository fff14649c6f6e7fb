"""`kb-mcp serve`: the MCP server over stdio (default) or streamable HTTP."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from functools import partial
from typing import TYPE_CHECKING

from kb_mcp.kb.errors import KbMcpError
from kb_mcp.server import exit_status, logs
from kb_mcp.server.agents import SHARED_CLIENT, read_agents
from kb_mcp.server.env import ENV_FILES
from kb_mcp.server.token import add_token_arguments, read_token

if TYPE_CHECKING:
    from kb_mcp.server.app import KbMcpServer
    from kb_mcp.server.transport import BearerGate, HttpOptions
    from kb_mcp.tools.context import ToolContext
    from kb_mcp.tools.source import FileAccess

# The MCP SDK takes about a second to import: it is imported when `serve` runs, not when the
# CLI parses its arguments (so other commands stay quick).

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the `serve` command."""
    p = sub.add_parser(
        "serve",
        help="run the MCP server (stdio by default, --http for a shared server)",
        description="Serve the kb-mcp tools, KB resources and round prompt to MCP clients. Over stdio "
        "(the default) an agent starts it itself; with --http one server can be shared by a team.",
    )
    p.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (port 0 picks a free port)",
    )
    add_token_arguments(p, "the bearer token clients must send over HTTP; required unless bound to loopback")
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name (optionally NAME:PORT) clients may use to reach the HTTP server; repeatable. "
        "Loopback names are always allowed; others are refused (DNS-rebinding protection)",
    )
    p.add_argument(
        "--agents-file",
        metavar="PATH",
        help="with --http: a file of 'NAME TOKEN' lines, one per agent, so the server tells its agents apart: "
        "each is the only verifier of what it verifies and one client of the KB (its outcomes, lessons and jobs "
        "are its own). Default: $KB_MCP_AGENTS. Agents of the shared token are one client to the KB",
    )
    p.add_argument(
        "--files",
        action="append",
        default=None,
        metavar="DIR",
        help="with --http: a folder whose files (.py problems and candidates, .ncu-rep/.csv reports) clients may "
        "name by path; repeatable. Default: $KB_MCP_FILES (folders separated by ':'), else none: clients send the "
        "text, and the server reads no file for them. A stdio server reads any file its user can",
    )
    p.add_argument(
        "--attempts",
        choices=("flag", "invalid"),
        help="what a candidate's sandbox attempt (a program, connection, write or read the sandbox refuses) makes "
        "of its verdict: 'flag' keeps it as measured but held for review, never credited (the default); 'invalid' "
        "rejects it. Default: KB_MCP_ATTEMPTS, else flag",
    )
    p.add_argument("--log-level", default="INFO", choices=logs.LEVELS, help="stderr log level (default INFO)")
    p.set_defaults(func=run)


def _stats_line(server: KbMcpServer) -> str:
    from kb_mcp.server.kb_views import kb_stats

    stats = kb_stats(server.kb_ctx.store, server.kb_ctx.kb_path).stats
    return (
        f"{sum(stats.states.values())} states, {sum(stats.optimizations.values())} optimizations, "
        f"{sum(stats.outcomes.values())} outcomes"
    )


def _tokens_line(opts: HttpOptions) -> str:
    """Which bearer tokens the server takes, for its banner."""
    if not opts.credentials.required:
        return "bearer token off"
    agents = opts.agents_file.agents() if opts.agents_file is not None else ()
    kinds = (["the shared token"] if opts.token else []) + \
        ([f"{len(agents)} agents' own tokens ({', '.join(a.name for a in agents[:5])}"
          f"{', ...' if len(agents) > 5 else ''}; {opts.agents_file.path} is read again when it changes)"]
         if opts.agents_file is not None else [])
    return "bearer token required: " + " or ".join(kinds)


def _attempt_policy(choice: str | None) -> None:
    """Makes `--attempts` the server's policy for sandbox attempts (`harness.sandbox.attempts.policy` reads
    it on every verdict); without it $KB_MCP_ATTEMPTS is (checked with the other settings)."""
    from kb_mcp.harness.sandbox.attempts import ENV_ATTEMPTS

    if choice is not None:
        os.environ[ENV_ATTEMPTS] = choice


def _refused_settings() -> str | None:
    """Why the server must not start on this environment's KB_MCP_ settings (None: it may), in the words
    of the readers `kb-mcp doctor` asks; the sandbox attempts policy is logged once it is known good."""
    from kb_mcp.harness.sandbox.attempts import policy
    from kb_mcp.server.doctor import refused_settings

    refused = refused_settings()
    if refused:
        return "; ".join(refused)  # each names its variable and what it takes
    log.info("sandbox attempts: %s", "verdicts are invalid" if policy() == "invalid" else "verdicts are flagged")
    return None


def file_access(args: argparse.Namespace, http: bool) -> FileAccess | None:
    """What the server's clients may have it read: anything over stdio (the client is the server's own
    user), over HTTP only the folders of --files, else of $KB_MCP_FILES, else none. Raises ValueError
    (the operator's to fix) for --files without --http or a folder that is not one."""
    from kb_mcp.tools.source import FileAccess

    if not http:
        if args.files:
            raise ValueError("--files applies to --http only: a stdio server's client is its own user, "
                             "who may name any file it can read")
        return None
    folders = args.files if args.files is not None else \
        [f for f in os.environ.get(ENV_FILES, "").split(os.pathsep) if f.strip()]
    try:
        files = FileAccess.of(folders)
    except ValueError as exc:
        raise ValueError(f"--files/${ENV_FILES}: {exc}") from exc
    log.info("files of this machine read for clients: %s",
             ", ".join(map(str, files.folders)) if files.folders else "none (clients send the text)")
    return files


def _http_options(args: argparse.Namespace) -> HttpOptions | None:
    """The HTTP configuration of --http, its tokens and agents file (None: serve stdio); raises
    ValueError or ServeError (the operator's to fix) for one that must not start."""
    from kb_mcp.server.transport import http_options

    token = read_token(args)
    if args.http:
        return http_options(args.http, token, args.allow_host, read_agents(args.agents_file, token))
    if args.agents_file:
        raise ValueError("--agents-file applies to --http only: a stdio server has one client, the agent that "
                         "started it")
    return None


def run(args: argparse.Namespace) -> int:
    """Serves until the client disconnects (stdio) or the process is interrupted (HTTP)."""
    import anyio

    from kb_mcp.server.app import package_version
    from kb_mcp.server.banner import http_connect_lines, print_banner, stdio_connect_lines, token_hint_lines
    from kb_mcp.server.session_limit import sessions_per_client
    from kb_mcp.server.transport import ServeError, serve_http
    from kb_mcp.tools.context import ToolContext

    logs.configure(args.log_level)
    logs.log_attempts()
    _attempt_policy(args.attempts)
    refused = _refused_settings()
    if refused is not None:  # a value every call (or every verdict) would be refused for: not started
        print(f"kb-mcp serve: {refused}", file=sys.stderr)
        return exit_status.ENVIRONMENT
    try:
        options = _http_options(args)
        files = file_access(args, http=options is not None)
        sessions_per = sessions_per_client() if options is not None else 0
    except (ServeError, ValueError, KbMcpError) as exc:  # an option, a file, a setting: each says whose
        print(f"kb-mcp serve: {exc}", file=sys.stderr)
        return exit_status.of(exc, default="usage")
    ctx = ToolContext(args.kb, client_name=SHARED_CLIENT if options else "mcp", files=files)
    built = _built(ctx, adopt_client_name=options is None)
    if isinstance(built, int):
        return built
    server, stats_line = built
    tools = list(server.specs)
    gpu_tools = server.gpu_tools
    try:
        if options is None:
            if sys.stdin.isatty():
                print_banner(
                    version=package_version(),
                    kb_path=ctx.kb_path,
                    stats_line=stats_line,
                    tools=tools,
                    gpu_tools=gpu_tools,
                    connect=stdio_connect_lines(args.kb),
                    footer="serving MCP on stdin/stdout: an agent starts this command itself; Ctrl-C quits",
                )
            else:
                log.info("kb-mcp %s serving %s over stdio (%s)", package_version(), ctx.kb_path, stats_line)
            anyio.run(server.run_stdio_async)
        else:
            app = _http_app(server, options, sessions_per)

            def ready(port: int, opts: HttpOptions) -> None:
                url = opts.url(port)
                print_banner(
                    version=package_version(),
                    kb_path=ctx.kb_path,
                    stats_line=stats_line,
                    tools=tools,
                    gpu_tools=gpu_tools,
                    connect=http_connect_lines(url, opts.credentials.required) + token_hint_lines(opts.token),
                    footer=f"serving http {url} ({_tokens_line(opts)}; "
                    f"allowed hosts: {', '.join(opts.allowed_hosts)}); Ctrl-C quits",
                )

            anyio.run(serve_http, app, options, partial(ready, opts=options))
    except ServeError as exc:
        print(f"kb-mcp serve: {exc}", file=sys.stderr)
        return exit_status.of(exc)
    except KeyboardInterrupt:
        pass
    finally:
        _finish(server, ctx)
    return exit_status.OK


def _http_app(server: KbMcpServer, options: HttpOptions, sessions_per: int) -> BearerGate:
    """The MCP app over streamable HTTP behind the gate. The gate bounds request bodies; the SDK's own
    bound (4 MiB by default) is set to the same, so that a body the gate lets through is never refused
    below it in other words. Each client holds at most `sessions_per` sessions (the gate refuses it
    more); where every session has an owner, the SDK's own limit, which names no one, is lifted
    (sessions.py says why)."""
    from kb_mcp.server.sessions import SESSION_IDLE_S, SessionCap, sdk_max_sessions
    from kb_mcp.server.transport import MAX_REQUEST_BYTES, BearerGate

    mcp_app = server.streamable_http_app(transport_security=options.security(), host=options.host,
                                         max_request_body_size=MAX_REQUEST_BYTES,
                                         session_idle_timeout=SESSION_IDLE_S,
                                         max_sessions=sdk_max_sessions(options.credentials.required))
    return BearerGate(mcp_app, options.credentials, sessions=SessionCap(server.session_manager, sessions_per))


def _built(ctx: ToolContext, adopt_client_name: bool) -> tuple[KbMcpServer, str] | int:
    """The server on the KB, opened now, and its stats line; or the exit status where it cannot open.
    A KB is created where nothing of one is yet; a missing one beside its remains, a damaged or a
    foreign one is refused here, with its name and what to do, instead of failing the first tool call."""
    from kb_mcp.server.app import build_server

    try:
        server = build_server(ctx, adopt_client_name=adopt_client_name)
        return server, _stats_line(server)
    except KbMcpError as exc:
        print(f"kb-mcp serve: cannot open the KB {ctx.kb_path}: {exc}", file=sys.stderr)
        return exit_status.of(exc)
    except Exception as exc:
        log.exception("cannot open the KB %s", ctx.kb_path)
        print(f"kb-mcp serve: cannot open the KB {ctx.kb_path}: {exc} (a kb-mcp bug: the traceback is above)",
              file=sys.stderr)
        return exit_status.BUG


def _finish(server: KbMcpServer, ctx: ToolContext) -> None:
    """Lets running jobs end (their results land in the KB's artifacts), then stops the workers.

    A Ctrl-C while waiting abandons them: the process exits at once, and any server on this KB
    then reports those jobs `interrupted` (their owner process is gone).
    """
    running = [r.job_id for r in server.jobs.store.list() if not r.finished and r.owner.endswith(f":{os.getpid()}")]
    if running:
        log.info("waiting for %d job(s) to finish: %s (Ctrl-C abandons them)", len(running), ", ".join(running))
    try:
        server.jobs.shutdown(wait=True)
    except KeyboardInterrupt:
        log.warning("abandoned running jobs; they will read as interrupted")
        ctx.close()
        os._exit(exit_status.INTERRUPTED)  # job threads are not daemons: a normal exit would wait for them again
    ctx.close()
