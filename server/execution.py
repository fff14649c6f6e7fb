"""Running a tool function in a worker thread, with failures turned into messages an agent can
act on.

Direct MCP calls and background jobs both go through `ToolRunner`, so they report errors in the
same words. GPU tools take turns on the GPU lane of the ToolContext (tools.lane).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ValidationError

from kb_mcp.harness.problem import ProblemError
from kb_mcp.server.registry import ToolSpec
from kb_mcp.tools.base import Progress, ToolError
from kb_mcp.tools.context import ToolContext

log = logging.getLogger(__name__)

_MAX_SHOWN_INPUT = 60  # characters of a rejected value echoed back (sources can be huge)


class ToolFailure(Exception):
    """A tool call that failed; `message` is what the agent reads, `expected` is False for bugs."""

    def __init__(self, message: str, *, expected: bool) -> None:
        super().__init__(message)
        self.message = message
        self.expected = expected


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
    """Maps an exception raised by a tool to the message the caller sees."""
    if isinstance(exc, ToolFailure):
        return exc
    if isinstance(exc, (ToolError, ProblemError)):
        return ToolFailure(str(exc), expected=True)
    if isinstance(exc, ValidationError):
        # Raised inside the tool (not by argument parsing): a model built from bad data.
        return ToolFailure(format_validation_error(spec.name, exc), expected=True)
    return ToolFailure(
        f"{spec.name} failed unexpectedly: {type(exc).__name__}: {exc}. "
        "This is a kb-mcp bug, not a problem with your arguments; the server log (stderr) has the traceback.",
        expected=False,
    )


def parse_request(spec: ToolSpec, arguments: dict[str, Any]) -> BaseModel:
    """Validates raw arguments into the tool's Request; raises ToolFailure with a readable message."""
    try:
        return spec.request.model_validate(arguments)
    except ValidationError as exc:
        raise ToolFailure(format_validation_error(spec.name, exc, spec.request), expected=True) from exc


class ToolRunner:
    """Calls tool functions for one server (or CLI) process, sharing its ToolContext.

    GPU tools take turns on the context's GPU lane inside their own `run` (tools.lane), so a
    campaign calling the tool functions directly takes turns with MCP calls and jobs too.
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
            failure = describe_failure(spec, exc)
            if not failure.expected:  # expected failures are the caller's to fix; callers log them
                log.exception("%s raised an unexpected exception", spec.name)
            raise failure from exc
        if isinstance(result, spec.result):
            return result
        try:  # a tool returning a dict or a compatible model still gets checked against its schema
            return spec.result.model_validate(result, from_attributes=True)
        except ValidationError as exc:
            log.error("%s returned a result that does not match %s: %s", spec.name, spec.result.__name__, exc)
            raise ToolFailure(
                f"{spec.name} produced a malformed result (a kb-mcp bug); the server log has the details.",
                expected=False,
            ) from exc
