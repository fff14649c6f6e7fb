"""What `kb-mcp doctor` reports (`server.doctor` runs the checks): each check's line, and the report
they add up to, with its exit status for scripts."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from kb_mcp.server import exit_status

__all__ = ["Check", "Report", "Status"]


class Status(str, Enum):
    """How a check went: `fail` makes `doctor` exit 1; `warn` is something that limits what works."""

    ok = "ok"
    info = "info"
    warn = "warn"
    fail = "fail"


class Check(BaseModel):
    """One line of the doctor's screen."""

    model_config = ConfigDict(extra="forbid")

    name: str
    status: Status
    summary: str = Field(description="what was found")
    fix: str | None = Field(None, description="what to do about it (set for warn and fail)")


class Report(BaseModel):
    """Every check, and the exit status they add up to."""

    model_config = ConfigDict(extra="forbid")

    version: str
    require_gpu: bool
    checks: list[Check]

    @property
    def exit_code(self) -> int:
        """0 when nothing failed, else the environment's status: a failed check is the machine's to fix."""
        return exit_status.ENVIRONMENT if any(c.status == Status.fail for c in self.checks) else exit_status.OK
