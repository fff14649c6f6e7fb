"""The server's bounds on the limits a caller may ask for in `VerifyOptions` (beyond them a
request is refused, with the cap in the message)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from kb_mcp.harness.judgment.verdict import VerifyOptions
from kb_mcp.kb import settings

__all__ = ["Caps"]


class Caps(BaseModel):
    """Server-side bounds on the limits a caller may ask for (beyond them a request is refused).

    Set by the server's operator through `KB_MCP_MAX_TIMEOUT_S` and `KB_MCP_MAX_COMPILE_TIMEOUT_S`.
    """

    ENV: ClassVar[dict[str, str]] = {"timeout_s": "KB_MCP_MAX_TIMEOUT_S",
                                     "compile_timeout_s": "KB_MCP_MAX_COMPILE_TIMEOUT_S"}

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = 600.0
    compile_timeout_s: float = 1200.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Caps:
        """The caps this server runs with (defaults where the variables are unset). A value that is not
        a number of seconds above 0 (a cap of 0 or NaN would refuse every verification) is refused by
        name (`kb.errors.SettingError`: the operator's to fix, not a caller's)."""
        return cls(**{field: settings.seconds(var, cls.model_fields[field].default, environ, positive=True)
                      for field, var in cls.ENV.items()})

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
