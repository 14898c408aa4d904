"""Small file helpers that several parts of kappa share: atomic replacement and log tails."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_atomic", "write_json_atomic", "read_json", "tail"]


def write_atomic(path: str | Path, data: bytes | str, *, mode: int = 0o644) -> None:
    """Replace `path` with `data` so that a reader sees the old content or the new, never a part.

    The data goes to a temporary file in the same directory, created with `mode` (never wider
    for a moment), fsynced, `os.replace`d over `path`; then the directory is fsynced so that the
    rename survives a crash. A failure leaves `path` as it was and no temporary file behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_json_atomic(path: str | Path, obj: Any, *, mode: int = 0o644, indent: int | None = 1) -> None:
    """`write_atomic` of `obj` as JSON (keys sorted, a trailing newline)."""
    write_atomic(path, json.dumps(obj, indent=indent, sort_keys=True) + "\n", mode=mode)


def read_json(path: str | Path) -> Any | None:
    """The JSON in `path`; None when the file is missing, unreadable or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def tail(path: str | Path, lines: int = 40, max_bytes: int = 64_000) -> str:
    """The last `lines` lines of a text file ('' if there is none), reading at most `max_bytes`."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])
