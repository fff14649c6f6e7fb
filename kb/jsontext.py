"""JSON as the KB's files hold it: finite numbers only, read and written.

Python's `json` reads and writes NaN and Infinity by default, though they are not JSON. No KB record
holds one, and one that got in would spread into every sum it joins (a NaN speedup makes every
expected speedup of its state NaN, for good). So every file of a KB (its base file, journal and
pending writes) and every file imported or merged is read with `loads`, which refuses them as it
refuses any other text that is not JSON; and everything is written with `dumps`, so that a value
that should never have been made fails where it is written, never in a later reader.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["NotJSONNumber", "dumps", "loads"]


class NotJSONNumber(ValueError):
    """NaN, Infinity or -Infinity where a JSON number may stand (they are not JSON)."""


class _Constant(str):
    """Stands for a NaN or infinity while its place is looked for."""


def _refuse(name: str) -> Any:
    raise NotJSONNumber(f"{name} is not a JSON number")


def _first_constant(value: Any, path: tuple[str, ...] = ()) -> tuple[str, tuple[str, ...]] | None:
    """The first NaN or infinity in a value parsed with `_Constant`s in their place, and where it is."""
    if isinstance(value, _Constant):
        return str(value), path
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        found = _first_constant(child, (*path, str(key)))
        if found is not None:
            return found
    return None


def loads(text: str | bytes) -> Any:
    """Parses JSON text; raises ValueError (json.JSONDecodeError, or NotJSONNumber for NaN and the
    infinities, naming where the first one is) for text that is not JSON."""
    try:
        return json.loads(text, parse_constant=_refuse)
    except NotJSONNumber:
        # Only now, on text already refused, is it parsed again to say where: a reader pays nothing.
        found = _first_constant(json.loads(text, parse_constant=_Constant))
        if found is None:  # the keys of an object are strings: a constant can only be a value
            raise
        name, path = found
        raise NotJSONNumber(f"{name} is not a JSON number (at {'/'.join(path) or 'the top'})") from None


def dumps(value: Any, **options: Any) -> str:
    """JSON text of `value`; raises ValueError for a NaN or infinite float anywhere in it."""
    return json.dumps(value, allow_nan=False, **options)
