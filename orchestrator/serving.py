"""Publishing a serving alias to readers: an atomically replaced pointer file next to the tables.

The registry is the truth of which version an alias serves; the pointer file
`<warehouse>/_aliases/<alias>.json` is where readers look, so a reader needs nothing but the
warehouse path (any Delta reader can follow `table`). A pointer is written to a temporary file
in the same directory, fsynced, then `os.replace`d over the old one and the directory fsynced:
a reader sees the old pointer or the new one, never a half-written file.

`publish_current` is the only way the orchestrator publishes: under an exclusive file lock it
reads what the registry says the alias serves *now* and writes that, then marks it published.
So two publishers that race (a promote and a rollback, or a reconcile) always leave the
pointer equal to the registry, whatever order they finish in.

Public API:
- `resolve_alias(alias, settings=None) -> dict` (pointer file only; NotFoundError if missing)
- `open_alias(alias, settings=None) -> deltalake.DeltaTable`
- `write_pointer(path, pointer)`, `pointer_path(warehouse, alias)`
- `publish_current(k, alias) -> dict | None`
- `set_serving_states(k, pipeline, new_version, old_version)`: serving / standby in the registry
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from orchestrator.core.exceptions import NotFoundError, SinkError
from orchestrator.core.names import validate_alias_name

ALIASES_DIR = "_aliases"


def pointer_path(warehouse: str | Path, alias: str) -> Path:
    validate_alias_name(alias)
    return Path(warehouse) / ALIASES_DIR / f"{alias}.json"


def _settings(settings: Any):
    if settings is None:
        from orchestrator.core.settings import resolve_settings

        settings = resolve_settings()
    return settings


def write_pointer(path: Path, pointer: dict[str, Any]) -> None:
    """Atomically replace `path` with `pointer` as JSON (tmp + fsync + os.replace + dir fsync)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(pointer, sort_keys=True) + "\n").encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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


def read_pointer(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def resolve_alias(alias: str, settings: Any = None) -> dict[str, Any]:
    """The alias's published pointer: {"alias","pipeline","version","table","published_at"}.

    Reads the pointer file only (no registry), which is all a reader needs.
    """
    settings = _settings(settings)
    path = pointer_path(settings.warehouse, alias)
    pointer = read_pointer(path)
    if pointer is None:
        raise NotFoundError(
            f"alias {alias!r} is not published: no pointer file at {path}; promote a version of "
            f"its pipeline first (`kappa promote <pipeline> <version>`)"
        )
    return pointer


def open_alias(alias: str, settings: Any = None):
    """The Delta table the alias serves now, as a `deltalake.DeltaTable`."""
    from deltalake import DeltaTable

    pointer = resolve_alias(alias, settings)
    try:
        return DeltaTable(pointer["table"])
    except Exception as e:  # TableNotFoundError and friends
        raise SinkError(
            f"alias {alias!r} points at {pointer['pipeline']} v{pointer['version']}, whose table "
            f"{pointer['table']} cannot be opened ({e}); roll back with `kappa rollback "
            f"{pointer['pipeline']}` or run `kappa reconcile`"
        ) from None


@contextmanager
def alias_lock(path: Path) -> Iterator[None]:
    """Serialize publishers of one alias (all processes on this host)."""
    lock = path.with_name(f".{path.stem}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def publish_current(k, alias: str) -> dict[str, Any] | None:
    """Publish the version the registry says `alias` serves now; return the pointer written.

    Returns None when the registry has no such alias (nothing to publish). Idempotent.
    """
    path = k.alias_file(alias)
    with alias_lock(path):
        rec = k.registry.get_alias(alias)
        if rec is None or rec.version is None:
            return None
        table = str(k.paths(rec.pipeline, rec.version).table)
        pointer = {
            "alias": alias, "pipeline": rec.pipeline, "version": rec.version,
            "table": table, "published_at": time.time(),
        }
        current = read_pointer(path)
        if (current and current.get("version") == rec.version and current.get("table") == table
                and current.get("pipeline") == rec.pipeline):
            pointer = current
        else:
            write_pointer(path, pointer)
        if getattr(rec, "published_version", None) != rec.version:
            k.registry.mark_published(alias, rec.version)
        return pointer


def set_serving_states(k, pipeline: str, new_version: int, old_version: int | None) -> None:
    """The new version serves; the one it replaced is standby from now (its grace period starts)."""
    reg = k.registry
    rec = reg.get_version(pipeline, new_version)
    if rec.state != "serving":
        details = {kk: v for kk, v in (rec.details or {}).items() if kk != "standby_since"}
        reg.set_state(pipeline, new_version, "serving", error=None, details=details)
    if old_version is not None and old_version != new_version:
        old = reg.get_version(pipeline, old_version)
        if old.state == "serving":
            reg.set_state(pipeline, old_version, "standby",
                          details={**(old.details or {}), "standby_since": time.time()})
