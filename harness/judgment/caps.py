"""The server's bounds on the limits a caller may ask for in `VerifyOptions` (beyond them a
request is refused, with the cap in the message)."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict

from kb_mcp.harness.judgment.verdict import VerifyOptions

__all__ = ["Caps"]


class Caps(BaseModel):
    """Server-side bounds on the limits a caller may ask for (beyond them a request is refused).

    Set by the server's operator through `KB_MCP_MAX_TIMEOUT_S` and `KB_MCP_MAX_COMPILE_TIMEOUT_S`.
    """

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = 600.0
    compile_timeout_s: float = 1200.0

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Caps:
        """The caps this server runs with (defaults where the variables are unset)."""
        env = os.environ if environ is None else environ
        values: dict[str, float] = {}
        for field, var in (("timeout_s", "KB_MCP_MAX_TIMEOUT_S"), ("compile_timeout_s",
                                                                   "KB_MCP_MAX_COMPILE_TIMEOUT_S")):
            if env.get(var):
                try:
                    values[field] = float(env[var])
                except ValueError as exc:
                    raise ValueError(f"${var} must be a number of seconds, got {env[var]!r}") from exc
        return cls(**values)

    def refusal(self, options: VerifyOptions) -> str | None:
        """Why `options` ask for more than this server allows, or None when they do not."""
        over = [
            f"options.{name}={getattr(options, name):g} is above this server's cap of {cap:g} s"
            for name, cap in (("timeout_s", self.timeout_s), ("compile_timeout_s", self.compile_timeout_s))
            if getattr(options, name) > cap
        ]
        if not over:
            return None
        return ("; ".join(over) + ". Ask for at most the cap (limits above the defaults also flag the verdict "
                "and keep it out of scores); the server's operator sets the caps")
