"""Small file helpers that several parts of kappa share: atomic replacement and log tails."""

from __future__ import annotations

import glob
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

__all__ = ["STALE_TMP_SECONDS", "write_atomic", "write_json_atomic", "read_json", "tail", "remove_stale_tmp"]

#: A temporary file of `write_atomic` this old was left by a process that died mid-write (a write
#: takes milliseconds): the next write of the same file removes it.
STALE_TMP_SECONDS = 600.0


def remove_stale_tmp(path: str | Path, older_than: float = STALE_TMP_SECONDS) -> list[Path]:
    """Remove the temporary files of `path` that a crashed `write_atomic` left; the ones removed.

    Only those older than `older_than` seconds: a younger one may be another process's write in
    progress (by age, not by PID, so that a writer on another host sharing the directory is safe).
    """
    path = Path(path)
    removed = []
    now = time.time()
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        try:
            if now - tmp.lstat().st_mtime > older_than:
                tmp.unlink()
                removed.append(tmp)
        except FileNotFoundError:  # another writer removed it first
            pass
    return removed


def write_atomic(path: str | Path, data: bytes | str, *, mode: int = 0o644, make_parents: bool = True) -> None:
    """Replace `path` with `data` so that a reader sees the old content or the new, never a part.

    The data goes to a temporary file in the same directory, fsynced, `os.replace`d over `path`;
    then the directory is fsynced so that the rename survives a crash. The temporary file is
    created 0600 (`os.open` with the mode, so a file of secrets is never readable by others, not
    even for a moment, and never chmod-ed) and widened to `mode` before any data is written when
    `mode` is wider (0644 for the files readers need). A failure leaves `path` as it was and no
    temporary file behind; what a killed process leaves is removed by the next write of `path`
    (`remove_stale_tmp`). ``make_parents=False``: a missing directory is FileNotFoundError, not
    created again (a file beside a version that a concurrent retire deleted stays deleted).
    """
    path = Path(path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    remove_stale_tmp(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode != 0o600:
                os.fchmod(f.fileno(), mode)
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


def write_json_atomic(path: str | Path, obj: Any, *, mode: int = 0o644, indent: int | None = 1,
                      make_parents: bool = True) -> None:
    """`write_atomic` of `obj` as JSON (keys sorted, a trailing newline)."""
    write_atomic(path, json.dumps(obj, indent=indent, sort_keys=True) + "\n", mode=mode, make_parents=make_parents)


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
