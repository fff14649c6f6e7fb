"""What may leave the server: secret values never, and a caller's private text only to that caller.

* **Redaction.** Every text the server returns, stores in the KB or writes to its artifacts and
  job records passes `redact` first (a file kept as it is, like an Nsight Compute report, is
  checked with `secret_in` and not kept when a secret is in it). The secrets are the values of
  the server's own environment variables whose names look secret (tokens, keys, passwords:
  `SECRET_NAME`), of the variables named in `$KB_MCP_REDACT_ENV` (comma-separated names), the
  lines of `$KB_MCP_REDACT_FILE`, and values the server registers itself (`register_secret`, e.g.
  the HTTP bearer token read from its file). Each is also caught base64- and hex-encoded.
  Redaction is a second line: the sandboxed worker's scrubbed environment is what keeps secrets
  out of a candidate's reach.
* **Private fields.** Candidate output, exception text and compiler logs belong to the caller who
  submitted the candidate. Result models mark such fields with `private()`; `public_copy` blanks
  them, for everyone else (a job's result read without its `job_key`).
"""

from __future__ import annotations

import base64
import os
import re
import threading
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, Field

__all__ = [
    "ENV_REDACT_ENV",
    "ENV_REDACT_FILE",
    "SECRET_NAME",
    "private",
    "public_copy",
    "redact",
    "redact_data",
    "redact_model",
    "register_secret",
    "secret_in",
    "secret_values",
]

ENV_REDACT_ENV = "KB_MCP_REDACT_ENV"
ENV_REDACT_FILE = "KB_MCP_REDACT_FILE"
SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|COOKIE|SESSION|(^|_)KEY$|(^|_)AUTH($|_)",
    re.IGNORECASE,
)
MIN_SECRET_CHARS = 8  # shorter values ("1", "true") would blank ordinary text
_NOT_SECRET = frozenset({"SSH_AUTH_SOCK", "KB_MCP_TOKEN_FILE", ENV_REDACT_FILE, ENV_REDACT_ENV})

_registered: set[str] = set()
_lock = threading.Lock()

M = TypeVar("M", bound=BaseModel)


def register_secret(value: str) -> None:
    """Adds a value the server holds itself (not from its environment) to what is redacted."""
    if value and len(value) >= MIN_SECRET_CHARS:
        with _lock:
            _registered.add(value)


def secret_values(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Secret value -> the name shown in its place, from the environment, the redact file and registrations."""
    env = os.environ if environ is None else environ
    named = {n.strip() for n in env.get(ENV_REDACT_ENV, "").split(",") if n.strip()}
    out: dict[str, str] = {}
    for name, value in env.items():
        if (name in named or (SECRET_NAME.search(name) and name not in _NOT_SECRET)) and len(value) >= MIN_SECRET_CHARS:
            out[value] = f"${name}"
    path = env.get(ENV_REDACT_FILE)
    if path:
        try:
            lines = Path(path).expanduser().read_text().splitlines()
        except OSError:
            lines = []  # a missing file redacts nothing extra; the server warns about it at start
        out.update({line.strip(): "a configured secret" for line in lines if len(line.strip()) >= MIN_SECRET_CHARS})
    with _lock:
        out.update(dict.fromkeys(_registered, "a server secret"))
    return out


def _encodings(value: str) -> Iterable[str]:
    """The value and the forms a candidate could print it in without spelling it out."""
    raw = value.encode()
    yield value
    yield raw.hex()
    yield raw.hex().upper()
    for shift in range(3):  # base64 depends on where the value starts within a 3-byte group
        for enc in (base64.b64encode, base64.urlsafe_b64encode):
            text = enc(b"\0" * shift + raw).decode()
            # only the characters whose 6 bits all come from the value (not the prefix, not padding)
            core = text[-(-8 * shift // 6):(8 * (shift + len(raw))) // 6]
            if len(core) >= MIN_SECRET_CHARS:
                yield core


@lru_cache(maxsize=8)
def _pattern(items: tuple[tuple[str, str], ...]) -> tuple[re.Pattern[str] | None, dict[str, str]]:
    names: dict[str, str] = {}
    for value, name in items:
        for form in _encodings(value):
            names.setdefault(form, name)
    if not names:
        return None, names
    alternatives = sorted(names, key=len, reverse=True)  # the longest form wins where two overlap
    return re.compile("|".join(re.escape(a) for a in alternatives)), names


def redact(text: str, secrets: Mapping[str, str] | None = None) -> str:
    """`text` with every secret value (and its encodings) replaced by `[redacted NAME]`."""
    if not text:
        return text
    table = secret_values() if secrets is None else secrets
    pattern, names = _pattern(tuple(sorted(table.items())))
    if pattern is None:
        return text
    return pattern.sub(lambda m: f"[redacted {names[m.group(0)]}]", text)


def secret_in(data: bytes, secrets: Mapping[str, str] | None = None) -> str | None:
    """The name of a secret whose value (or an encoding of it) appears in `data`, else None: for
    files kept as they are (a binary report), which cannot be redacted in place."""
    table = secret_values() if secrets is None else secrets
    pattern, names = _pattern(tuple(sorted(table.items())))
    if pattern is None or not data:
        return None
    found = pattern.search(data.decode("latin-1"))  # byte for byte: a value's ASCII bytes match as text
    return names[found.group(0)] if found else None


def redact_data(data: Any, secrets: Mapping[str, str] | None = None) -> Any:
    """JSON-like data with every string in it (keys too) redacted."""
    table = secret_values() if secrets is None else secrets
    if isinstance(data, str):
        return redact(data, table)
    if isinstance(data, Mapping):
        return {redact_data(k, table): redact_data(v, table) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact_data(v, table) for v in data]
    return data


def redact_model(model: M) -> M:
    """A copy of `model` with every string in it redacted (validated again, so it stays a valid `M`)."""
    table = secret_values()
    if not table:
        return model
    return type(model).model_validate(redact_data(model.model_dump(mode="json"), table))


# ---- private fields ---------------------------------------------------------------------------

_PRIVATE = "x-private"


def private(*default: Any, **kwargs: Any) -> Any:
    """A pydantic Field shown only to the caller who submitted the work (see `public_copy`);
    takes Field's arguments."""
    extra = dict(kwargs.pop("json_schema_extra", None) or {})
    extra[_PRIVATE] = True
    return Field(*default, json_schema_extra=extra, **kwargs)


def _is_private(model: type[BaseModel], name: str) -> bool:
    extra = model.model_fields[name].json_schema_extra
    return isinstance(extra, dict) and bool(extra.get(_PRIVATE))


def public_copy(model: M) -> M:
    """`model` with every private field (in it and in the models it holds) set back to its default."""
    update: dict[str, Any] = {}
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if _is_private(type(model), name):
            update[name] = field.get_default(call_default_factory=True)
        elif isinstance(value, BaseModel):
            update[name] = public_copy(value)
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            update[name] = [public_copy(v) for v in value]
    return model.model_copy(update=update) if update else model
