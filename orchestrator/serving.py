"""Publishing a serving alias to readers: an atomically replaced pointer file next to the tables.

The registry is the truth of which version an alias serves; the pointer file
`<warehouse>/_aliases/<alias>.json` (`orchestrator.core.paths.alias_pointer_path`) is where
readers look, so a reader needs nothing but the warehouse path (any Delta reader can follow
`table`). A pointer is replaced atomically (`orchestrator.core.files.write_atomic`: temporary
file, fsync, rename, directory fsync): a reader sees the old pointer or the new one, never a
half-written file.

`publish_current` is the only way the orchestrator publishes: under an exclusive file lock it
reads what the registry says the alias serves *now* and writes that, then marks it published.
So two publishers that race (a promote and a rollback, or a reconcile) always leave the
pointer equal to the registry, whatever order they finish in.
"""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.exceptions import NotFoundError, SinkError
from orchestrator.core.files import write_json_atomic
from orchestrator.core.kappa import Kappa
from orchestrator.core.paths import alias_pointer_path
from orchestrator.core.settings import Settings, resolve_settings
from orchestrator.core.states import VersionState

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["alias_lock", "open_alias", "publish_current", "read_pointer", "resolve_alias", "set_serving_states",
           "write_pointer"]


def write_pointer(path: Path, pointer: dict[str, Any]) -> None:
    """Atomically replace `path` with `pointer` as one line of JSON (readable by its owner only)."""
    write_json_atomic(path, pointer, mode=0o600, indent=None)


def read_pointer(path: Path) -> dict[str, Any] | None:
    """The pointer in `path`; None when there is none yet."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def resolve_alias(alias: str, settings: Settings | None = None) -> dict[str, Any]:
    """The alias's published pointer: {"alias","pipeline","version","table","published_at"}.

    Reads the pointer file only (no registry), which is all a reader needs.
    """
    settings = resolve_settings() if settings is None else settings
    path = alias_pointer_path(settings.warehouse, alias)
    pointer = read_pointer(path)
    if pointer is None:
        raise NotFoundError(
            f"alias {alias!r} is not published: no pointer file at {path}; promote a version of "
            f"its pipeline first (`kappa promote <pipeline> <version>`)"
        )
    return pointer


def open_alias(alias: str, settings: Settings | None = None) -> DeltaTable:
    """The Delta table the alias serves now."""
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


def publish_current(k: Kappa, alias: str) -> dict[str, Any] | None:
    """Publish the version the registry says `alias` serves now; return the pointer written.

    Returns None when the registry has no such alias (nothing to publish). Idempotent.
    """
    path = k.alias_file(alias)
    with alias_lock(path):
        rec = k.registry.get_alias(alias)
        if rec is None:
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
        if rec.needs_publish:
            k.registry.mark_published(alias, rec.version)
        return pointer


def set_serving_states(k: Kappa, pipeline: str, new_version: int, old_version: int | None) -> None:
    """The new version serves; the one it replaced is standby from now (its grace period starts)."""
    reg = k.registry
    rec = reg.get_version(pipeline, new_version)
    if rec.state != VersionState.SERVING:
        details = {kk: v for kk, v in rec.details.items() if kk != "standby_since"}
        reg.set_state(pipeline, new_version, VersionState.SERVING, error=None, details=details)
    if old_version is not None and old_version != new_version:
        old = reg.get_version(pipeline, old_version)
        if old.state == VersionState.SERVING:
            reg.set_state(pipeline, old_version, VersionState.STANDBY,
                          details={**old.details, "standby_since": time.time()})
