"""Running a tool function in a worker thread, with failures turned into messages that say whose
they are (see `kb_mcp.kb.errors`).

* the caller's mistake (bad arguments, a malformed problem): the message says what to fix;
* the environment's (KB file, disk, lock, permissions, input encoding): what and where, and what
  the operator can do; calling again with other arguments does not help;
* ours (a bug): said plainly, with an incident id that the traceback in the server log carries.

Direct MCP calls and background jobs both go through `ToolRunner`, so they report errors in the
same words; `ToolFailure.info` is the structured form MCP clients get. GPU tools take turns on the
GPU lane (tools.lane: machine-wide per GPU, harness.lane).
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from pydantic import BaseModel, ValidationError

from kb_mcp.harness.problem import ProblemError
from kb_mcp.kb.errors import (
    EnvironmentFault,
    ErrorInfo,
    InputEncodingError,
    InternalError,
    KbMcpError,
    Whose,
    storage_error,
)
from kb_mcp.server.logs import refusals
from kb_mcp.server.registry import ToolSpec
from kb_mcp.tools.base import Progress
from kb_mcp.tools.context import ToolContext

log = logging.getLogger(__name__)

_MAX_SHOWN_INPUT = 60  # characters of a rejected value echoed back (sources can be huge)


class ToolFailure(Exception):
    """A tool call that failed: `message` is what the agent reads, `info` the structured error
    (whose it is, the error type, where, what to do); `expected` is False only for bugs."""

    def __init__(self, message: str, *, expected: bool, info: ErrorInfo | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.expected = expected
        whose: Whose = "caller" if expected else "kb-mcp"
        self.info = info or ErrorInfo(whose=whose, type="ToolError" if expected else "InternalError", message=message)

    @property
    def whose(self) -> Whose:
        """Who can fix it: the caller, the environment (its operator), or kb-mcp (a bug)."""
        return self.info.whose


def unknown_tool(name: str, tools: list[str]) -> ToolFailure:
    """The caller's error for a call to a tool this server does not have, naming those it has."""
    message = f"no tool {name!r} on this server; its tools: {', '.join(sorted(tools))}"
    action = "call one of these (tools/list gives each one's input schema)"
    return ToolFailure(f"{message}. {action}", expected=True,
                       info=ErrorInfo(whose="caller", type="UnknownTool", message=message, action=action))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN_INPUT else text[: _MAX_SHOWN_INPUT - 3] + "..."


def format_validation_error(tool: str, exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line per bad field, naming the field, the problem and (briefly) the value given."""
    accepted = sorted(model.model_fields) if model is not None else []
    lines = [f"invalid arguments for {tool}:"]
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"]) or "(arguments)"
        kind = err["type"]
        if kind == "missing":
            lines.append(f"- {where}: required, but not given")
        elif kind == "extra_forbidden":
            hint = f" (accepted: {', '.join(accepted)})" if accepted else ""
            lines.append(f"- {where}: unknown argument{hint}")
        else:
            lines.append(f"- {where}: {err['msg']} (got {_short(err.get('input'))})")
    lines.append(f"Fix these and call {tool} again; its input schema describes every argument.")
    return "\n".join(lines)


def describe_failure(spec: ToolSpec, exc: BaseException) -> ToolFailure:
    """Maps an exception raised by a tool to the failure the caller sees, worded by whose it is."""
    if isinstance(exc, ToolFailure):
        return exc
    if isinstance(exc, ValidationError):
        # Raised inside the tool (not by argument parsing): a model built from bad input data.
        return ToolFailure(format_validation_error(spec.name, exc), expected=True)
    if isinstance(exc, ProblemError):
        return ToolFailure(str(exc), expected=True, info=ErrorInfo(whose="caller", type="ProblemError",
                                                                   message=str(exc)))
    error = _as_kb_mcp_error(exc)
    if isinstance(error, EnvironmentFault):
        return environment_failure(spec.name, error)
    if not isinstance(error, InternalError):
        return ToolFailure(str(error), expected=True, info=error.info())
    return internal_failure(spec.name, exc)


def _as_kb_mcp_error(exc: BaseException) -> KbMcpError:
    """The taxonomy's view of `exc`: file-system faults are the environment's, anything unknown ours."""
    if isinstance(exc, KbMcpError):
        return exc
    if isinstance(exc, UnicodeDecodeError):
        return InputEncodingError(
            f"an input is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})",
            action="save the file as UTF-8 (e.g. `iconv -f LATIN1 -t UTF-8`), then call again as before",
        )
    if isinstance(exc, OSError) and exc.errno is not None:
        return storage_error(exc, "use", exc.filename if isinstance(exc.filename, str) else None)
    return InternalError(f"{type(exc).__name__}: {exc}")


def environment_failure(tool: str, error: EnvironmentFault) -> ToolFailure:
    """The environment's fault, for the agent: not its arguments; what the operator should do."""
    text = (f"{tool} could not run because of a problem on the server's machine, not in your arguments: "
            f"{error.message.rstrip('. ')}.")
    if error.action:
        text += f" The operator can fix it: {error.action}."
    text += " Calling again with other arguments will not help; tell the user what this says."
    return ToolFailure(text, expected=True, info=error.info())


def internal_failure(tool: str, exc: BaseException) -> ToolFailure:
    """A kb-mcp bug: logged with its traceback under an incident id that the agent also gets."""
    incident = secrets.token_hex(4)
    log.error("%s failed unexpectedly (incident %s)", tool, incident, exc_info=exc)
    text = (f"{tool} failed because of a bug in kb-mcp, not because of your arguments or the machine: "
            f"{type(exc).__name__}: {exc}. The server log (stderr) has the traceback under incident {incident}; "
            "please report it. You may call again: a bug in one call does not harm the KB.")
    info = ErrorInfo(whose="kb-mcp", type=type(exc).__name__, message=str(exc), incident=incident,
                     action="report it with the traceback from the server log")
    return ToolFailure(text, expected=False, info=info)


def parse_request(spec: ToolSpec, arguments: dict[str, Any]) -> BaseModel:
    """Validates raw arguments into the tool's Request; raises ToolFailure with a readable message."""
    try:
        return spec.request.model_validate(arguments)
    except ValidationError as exc:
        raise ToolFailure(format_validation_error(spec.name, exc, spec.request), expected=True) from exc


class ToolRunner:
    """Calls tool functions for one server (or CLI) process, sharing its ToolContext.

    GPU tools take turns on the GPU lane inside their own `run` (tools.lane), so a campaign calling
    the tool functions directly takes turns with MCP calls and jobs too, and with every other
    kb-mcp process measuring on the same GPU.
    """

    def __init__(self, ctx: ToolContext) -> None:
        self.ctx = ctx

    def run(self, spec: ToolSpec, request: BaseModel, progress: Progress) -> BaseModel:
        """Runs `spec` on `request` in the calling (worker) thread; raises ToolFailure on any failure."""
        return self._call(spec, request, progress)

    def _call(self, spec: ToolSpec, request: BaseModel, progress: Progress) -> BaseModel:
        try:
            result = spec.run(self.ctx, request, progress)
        except Exception as exc:
            failure = describe_failure(spec, exc)  # a bug is logged there, with its traceback
            if failure.whose == "environment":  # the operator's to fix; a client calling in a loop repeats it
                refusals.log(log, logging.WARNING, f"{spec.name} failing for the machine", "its callers",
                             "%s: %s", spec.name, failure.info.message)
            raise failure from exc
        if isinstance(result, spec.result):
            return result
        try:  # a tool returning a dict or a compatible model still gets checked against its schema
            return spec.result.model_validate(result, from_attributes=True)
        except ValidationError as exc:
            raise internal_failure(spec.name, exc) from exc
