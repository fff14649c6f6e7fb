"""Why a model could not be decomposed, and whose it is to fix: the problem's own code (the caller's:
it fails, or runs past its time limit), or the decomposition's (ours: a legitimate model that the
tracer cannot split faithfully; the message says what in the model to change to get around it)."""

from __future__ import annotations

from typing import ClassVar

from kb_mcp.kb.errors import Fault


class DecompositionError(RuntimeError):
    """The model could not be decomposed (the message says at which step and why). The problem's own
    code failed: the caller's to fix, unless a subclass says otherwise (`whose`)."""

    whose: ClassVar[Fault] = "caller"

    def __init__(self, message: str, action: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.action = action  # what the one who can fix it may do (None: the message says it)


class PastTimeLimit(DecompositionError):
    """The problem's own code ran past the time limit in a step of its decomposition: the problem's
    fault (it never returns), or a limit too short for it (`limit_s` says which limit)."""

    def __init__(self, message: str, limit_s: float) -> None:
        super().__init__(message)
        self.limit_s = limit_s


class TracerLimit(DecompositionError):
    """A legitimate model the decomposition cannot split faithfully (ours): its parts would not compute
    what the model computes, so none is written. `action` says how the model's author can get around it."""

    whose: ClassVar[Fault] = "kb-mcp"
