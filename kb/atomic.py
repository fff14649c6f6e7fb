"""Files replaced whole: written to a temp file of their own beside the target, then renamed over it.

Every writer takes a temp name no other writer can hold at the same time, in this process or another:
the process id, the thread id and random bits (`unique_tag`), opened with O_EXCL. A name shared by
two writers (a fixed `.tmp`, or `.tmp<pid>` for threads of one process, several KB commits or
verifications at once) lets one writer truncate or rename away the other's half-written file, and the
other's rename then fails (FileNotFoundError) or publishes the wrong bytes. Readers see the old file or
the new one, never a mix.
"""

from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path

__all__ = ["temp_beside", "unique_tag", "write_atomic"]


def unique_tag() -> str:
    """`<pid>-<thread id>-<random>`: unique to this writer, now."""
    return f"{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}"


def temp_beside(path: Path, *, hidden: bool = True, suffix: str = "") -> Path:
    """A temp name beside `path` that no other writer uses: `.NAME.tmp-<tag>` (`suffix` after it,
    for tools that read the format from it)."""
    name = f".{path.name}" if hidden else path.name
    return path.with_name(f"{name}.tmp-{unique_tag()}{suffix}")


def write_atomic(path: Path, data: str | bytes, *, mode: int = 0o666, fsync: bool = False) -> None:
    """Replaces `path` with `data` in one rename (its folder must exist). `mode` is masked by the
    umask, as `Path.write_text`'s is; `fsync` makes the bytes durable before the rename."""
    blob = data.encode() if isinstance(data, str) else data
    tmp = temp_beside(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
