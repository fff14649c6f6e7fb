"""Numbers the operator sets in the environment (``KB_MCP_...``): read in one way, so a value kb-mcp
cannot use is refused by name (`SettingError`) rather than replaced by a default or bent into range."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import TypeVar

from kb_mcp.kb.errors import SettingError

__all__ = ["SWITCH_WORDS", "count", "seconds", "switch", "word"]

T = TypeVar("T")


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    value = (os.environ if environ is None else environ).get(name, "").strip()
    return value or None  # unset and empty both mean the default


def _refused(name: str, value: str, wanted: str, default: float | str) -> SettingError:
    shown = f"{default:g}" if isinstance(default, float | int) else default
    return SettingError(f"${name}={value!r} is not {wanted}", where=name,
                        action=f"set {name} to {wanted}, or unset it for the default ({shown})")


def seconds(name: str, default: float, environ: Mapping[str, str] | None = None, *, positive: bool = False) -> float:
    """A duration in seconds from `name` (a finite number >= 0; > 0 where `positive`: a limit of 0 s
    would refuse everything it bounds), else `default` where unset or empty."""
    value = _raw(name, environ)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        wanted = "a number of seconds, more than 0" if positive else "a number of seconds, 0 or more"
        raise _refused(name, value, wanted, default)
    return number


def word(name: str, default: str, words: Mapping[str, T], environ: Mapping[str, str] | None = None) -> T:
    """What `words` maps the value of `name` to (any case), else what it maps `default` to where unset or
    empty. Any other value is refused by name: a switch set to 'maybe' is not read as on."""
    value = _raw(name, environ)
    key = default if value is None else value.lower()
    if key not in words:
        raise _refused(name, value or "", "one of " + ", ".join(f"'{w}'" for w in words), default)
    return words[key]


# The words an on/off setting takes (any case); any other is refused by name, not read as on or off.
SWITCH_WORDS: Mapping[str, bool] = {"1": True, "true": True, "yes": True, "on": True,
                                    "0": False, "false": False, "no": False, "off": False}


def switch(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """An on/off setting (`SWITCH_WORDS`), else `default` where unset or empty; any other value is refused."""
    return word(name, "on" if default else "off", SWITCH_WORDS, environ)


def count(name: str, default: int, environ: Mapping[str, str] | None = None, *, positive: bool = False) -> int:
    """A whole number >= 0 from `name` (> 0 where `positive`: a limit of 0 would refuse everything it
    bounds), else `default` where unset or empty."""
    value = _raw(name, environ)
    if value is None:
        return default
    # digits only: no sign, no fraction, no exponent
    if not (value.isascii() and value.isdigit()) or (positive and int(value) == 0):
        raise _refused(name, value, "a whole number, more than 0" if positive else "a whole number, 0 or more", default)
    return int(value)
