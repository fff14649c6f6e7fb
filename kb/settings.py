"""Numbers the operator sets in the environment (``KB_MCP_...``): read in one way, so a value kb-mcp
cannot use is refused by name (`SettingError`) rather than replaced by a default or bent into range."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from kb_mcp.kb.errors import SettingError

__all__ = ["count", "seconds"]


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    value = (os.environ if environ is None else environ).get(name, "").strip()
    return value or None  # unset and empty both mean the default


def _refused(name: str, value: str, wanted: str, default: float) -> SettingError:
    return SettingError(f"${name}={value!r} is not {wanted}", where=name,
                        action=f"set {name} to {wanted}, or unset it for the default ({default:g})")


def seconds(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """A duration in seconds from `name` (a finite number >= 0), else `default` where unset or empty."""
    value = _raw(name, environ)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise _refused(name, value, "a number of seconds, 0 or more", default)
    return number


def count(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """A whole number >= 0 from `name`, else `default` where unset or empty."""
    value = _raw(name, environ)
    if value is None:
        return default
    if not value.isdigit():  # digits only: no sign, no fraction, no exponent
        raise _refused(name, value, "a whole number, 0 or more", default)
    return int(value)
