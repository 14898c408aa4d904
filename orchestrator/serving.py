"""Publishing a serving alias to readers: an atomically replaced pointer file next to the tables.

The registry is the truth of which version an alias serves; the pointer file
`<warehouse>/_aliases/<alias>.json` (`orchestrator.core.paths.alias_pointer_path`) is where
readers look, so a reader needs nothing but the warehouse location (any Delta reader can follow
`table`). The pointer is a location like the tables (`orchestrator.core.uris`: a local path or a URI
such as `s3://bucket/wh/_aliases/a.json`). It is replaced atomically (`uris.write_atomic`: locally a
temporary file, fsync, rename, directory fsync; on an object store one put): a reader sees the old
pointer or the new one, never a half-written file.

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

from pydantic import BaseModel, ConfigDict

from orchestrator.core.exceptions import ConflictError, NotFoundError, SinkError
from orchestrator.core import uris
from orchestrator.context import Kappa
from orchestrator.core.paths import ALIASES_DIR, alias_pointer_path
from orchestrator.core.pipelines import PipelineSpec
from orchestrator.core.settings import Settings, resolve_settings
from orchestrator.core.states import VersionState
from orchestrator.registry.values import STANDBY_KEYS

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["AliasInfo", "alias_lock", "describe_alias", "open_alias", "publish_current", "read_pointer",
           "registry_file_missing", "resolve_alias", "set_serving_states", "write_pointer"]


def write_pointer(path: str | Path, pointer: dict[str, Any]) -> None:
    """Atomically replace the file at location `path` with `pointer` as one line of JSON, readable by every
    reader (0644): it names a table, nothing secret, and readers are often other users than the orchestrator.

    SinkError when it cannot be written (a full disk, a read-only or unreachable warehouse): the file is
    then as it was, so readers still follow what it held, and the message says how to publish later."""
    try:
        uris.write_atomic(path, json.dumps(pointer, sort_keys=True) + "\n", mode=0o644)
    except OSError as e:
        raise SinkError(f"cannot write the alias pointer file {path}: {e.strerror or e}; readers still follow what it "
                        f"held before. Free space on (or repair) the warehouse, then run `kappa reconcile` or the "
                        f"command again to publish what the registry says") from None


def _pointer_problem(pointer: Any) -> str | None:
    if not isinstance(pointer, dict):
        return f"it holds a JSON {type(pointer).__name__}, not an object"
    missing = [f for f in ("pipeline", "version", "table") if f not in pointer]
    return f"it lacks {', '.join(missing)}" if missing else None


def read_pointer(path: str | Path, *, strict: bool = False) -> dict[str, Any] | None:
    """The pointer in `path`; None when there is none yet.

    A file that is not a pointer (truncated by a full disk or a copy, not JSON, fields missing) is
    None too unless `strict`: publishers then see "no pointer" and rewrite it, which is the
    repair (`publish_current`, `kappa reconcile`). `strict=True` (readers) raises SinkError
    naming the file and the repair instead.
    """
    raw = uris.read_text(path, errors="replace")
    if raw is None:
        return None
    try:
        pointer = json.loads(raw)
        problem = _pointer_problem(pointer)
    except ValueError as e:
        problem = f"it is not JSON ({e})"
    if problem is None:
        return pointer
    if strict:
        raise SinkError(f"the alias pointer file {path} is damaged ({problem}); rewrite it from the registry "
                        f"with `kappa reconcile`")
    return None


def resolve_alias(alias: str, settings: Settings | None = None) -> dict[str, Any]:
    """The alias's published pointer: {"alias","pipeline","version","table","published_at"}.

    Reads the pointer file only (no registry), which is all a reader needs. NotFoundError when
    it is not published, SinkError (naming the file and `kappa reconcile`) when the file is damaged.
    """
    settings = resolve_settings() if settings is None else settings
    path = alias_pointer_path(settings.warehouse, alias)
    pointer = read_pointer(path, strict=True)
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


class AliasInfo(BaseModel):
    """What an alias serves, for a reader (`kappa resolve`): the table, its pipeline version and Delta version,
    when it was published, and the registry's record of the flip when the registry is at hand."""

    model_config = ConfigDict(frozen=True)

    alias: str
    pipeline: str
    version: int
    table: str
    pointer_file: str
    #: When the pointer file readers follow was written (None: the flip is not published yet).
    published_at: float | None
    delta_version: int
    #: When the table's newest Delta commit was made (how fresh the served data is).
    delta_committed_at: float | None
    rules_version: str | None = None
    rules_hash: str | None = None
    previous_version: int | None = None
    flipped_at: float | None = None
    flipped_by: str | None = None
    reason: str | None = None
    #: The registry serves another version than the pointer says (a flip not yet published): readers
    #: still see `version` until `kappa reconcile` (or the flip's own retry) publishes it.
    pending_version: int | None = None


def registry_file_missing(settings: Settings) -> bool:
    """Whether the registry is a SQLite file that does not exist yet: opening it would create it, and it
    holds nothing, so a command that must not write (a reader, a dry run) skips it."""
    url = str(settings.registry_url or "")
    if not url.startswith("sqlite"):
        return False
    from sqlalchemy.engine import make_url

    try:
        database = make_url(url).database
    except Exception:
        return False
    return database not in (None, "", ":memory:") and not Path(database).expanduser().exists()


def describe_alias(k: Kappa, alias: str) -> AliasInfo:
    """What `alias` serves: its published pointer (what readers see) with the table's Delta version, plus the
    registry's record of the flip. Changes nothing; a SQLite registry that does not exist is not created.

    NotFoundError when the alias is neither published nor in the registry; SinkError when its pointer file
    is damaged or its table cannot be opened (both naming the repair).
    """
    from deltalake import DeltaTable

    path = k.alias_file(alias)
    pointer = read_pointer(path, strict=True)
    rec = None if registry_file_missing(k.settings) else k.registry.get_alias(alias)
    if pointer is None and rec is None:
        raise NotFoundError(f"alias {alias!r} is not published: no pointer file at {path} and no such alias in the "
                            f"registry; promote a version of its pipeline first (`kappa promote <pipeline> <version>`)")
    if pointer is not None:
        pipeline, version, table = pointer["pipeline"], int(pointer["version"]), str(pointer["table"])
    else:  # flipped in the registry, the pointer not written yet
        pipeline, version, table = rec.pipeline, rec.version, str(k.paths(rec.pipeline, rec.version).table)
    try:
        dt = DeltaTable(table)
        delta_version = dt.version()
        last = dt.history(1)
    except Exception as e:  # TableNotFoundError and friends
        raise SinkError(f"alias {alias!r} points at {pipeline} v{version}, whose table {table} cannot be opened "
                        f"({e}); roll back with `kappa rollback {pipeline}` or run `kappa reconcile`") from None
    committed = last[0].get("timestamp") if last else None
    info: dict[str, Any] = dict(
        alias=alias, pipeline=pipeline, version=version, table=table, pointer_file=str(path),
        published_at=(pointer or {}).get("published_at"), delta_version=delta_version,
        delta_committed_at=committed / 1000 if isinstance(committed, (int, float)) else None)
    if rec is not None:
        info.update(previous_version=rec.previous_version, flipped_at=rec.updated_at, flipped_by=rec.updated_by,
                    reason=rec.reason,
                    pending_version=rec.version if pointer is None or rec.version != version else None)
        if rec.pipeline == pipeline and rec.version == version:
            try:
                v = k.registry.get_version(pipeline, version)
                info.update(rules_version=v.rules_version, rules_hash=v.rules_hash)
            except NotFoundError:
                pass
    return AliasInfo(**info)


def _lock_file(k: Kappa, alias: str) -> Path:
    """The lock of the alias's publishers: next to a local pointer file, else under the state dir (an
    object store has no file locks)."""
    local = uris.local_path(k.alias_file(alias))
    return (local.parent if local is not None else k.settings.state_dir / ALIASES_DIR) / f".{alias}.lock"


@contextmanager
def alias_lock(lock: Path) -> Iterator[None]:
    """Serialize publishers of one alias (all processes on this host): an exclusive lock on the file `lock`."""
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
    with alias_lock(_lock_file(k, alias)):
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


def set_serving_states(k: Kappa, spec: PipelineSpec, new_version: int, old_version: int | None) -> None:
    """Repair the states after a flip whose transaction did not move them (a flip made by an older kappa).

    A flip made with `flip_alias(serve=True)` moved them itself. Each move here is a
    compare-and-swap from the state just read, made only while the alias still says so, checked in
    the move's own transaction (`set_state(served_by=...)`): a flip that lands between this read of
    the alias and the move must not be undone by it (two versions serving). A move that loses a
    race is left to whoever won it. A recorded error is kept, never erased.
    """
    reg, pipeline = k.registry, spec.name
    name = spec.alias
    alias = reg.get_alias(name)
    if alias is None or alias.pipeline != pipeline or alias.version != new_version:
        return
    rec = reg.get_version(pipeline, new_version)
    try:
        if rec.state in (VersionState.CAUGHT_UP, VersionState.STANDBY):
            details = {kk: v for kk, v in rec.details.items() if kk not in STANDBY_KEYS}
            reg.set_state(pipeline, new_version, VersionState.SERVING, expected=rec.state, details=details,
                          served_by=(name, True))
        if old_version is not None and old_version != new_version:
            old = reg.get_version(pipeline, old_version)
            if old.state == VersionState.SERVING:
                now = time.time()
                details = {**old.details, "standby_since": now,
                           "standby_until": now + spec.grace_period_seconds}
                reg.set_state(pipeline, old_version, VersionState.STANDBY, expected=VersionState.SERVING,
                              details=details, served_by=(name, False))
    except ConflictError:
        pass  # another operation moved it meanwhile; its move stands
