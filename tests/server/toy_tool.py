"""A tiny module following the tool convention, for testing the server's machinery on its own.

It counts to `n`, reporting progress at every step, and can fail on request the two ways a real
tool can: with a ToolError (the caller's fault) or with an unexpected exception (a bug).
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.tools.base import Progress, ToolError, no_progress
from kb_mcp.tools.context import ToolContext

NAME = "toy_count"
DESCRIPTION = "Counts to n, reporting progress at each step. For testing the server only."


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int = Field(ge=1, le=1000, description="how far to count")
    label: str = Field("toy", description="echoed back in the result")
    step_s: float = Field(0.0, ge=0.0, le=5.0, description="seconds to sleep at each step")
    fail: Literal["none", "tool_error", "crash"] = Field("none", description="fail on purpose")
    tags: list[str] = Field(default_factory=list, description="echoed back")


class Result(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str
    counted: int
    tags: list[str]
    kb_file: str
    note: str | None = None


def run(ctx: ToolContext, req: Request, progress: Progress = no_progress) -> Result:
    if req.fail == "tool_error":
        raise ToolError(f"cannot count for {req.label!r}: asked to fail; call again with fail='none'")
    counted = 0
    for i in range(req.n):
        if req.fail == "crash" and i == req.n // 2:
            raise ZeroDivisionError("division by zero in the middle of counting")
        counted += 1
        progress(i + 1, req.n, f"counted {i + 1} of {req.n}")
        if req.step_s:
            time.sleep(req.step_s)
    return Result(label=req.label, counted=counted, tags=req.tags, kb_file=ctx.kb_path.name)
