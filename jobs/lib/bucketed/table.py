"""The driver's side of a bucketed Delta table: create, check a replay, list files, commit, upkeep.

Layout: the table's columns plus the partition column ``key_bucket`` = CRC-32 of the key's UTF-8
bytes modulo the table's bucket count (fixed when the table is created, recorded in its
configuration as ``kappa.buckets``); one data file per bucket, rows sorted by key. An upsert
rewrites only the buckets its keys fall in, so the table holds at most one data file per bucket
whatever the number of micro-batches. Readers (delta-rs, Polars, Spark with Delta Lake, DuckDB
over the listed files) see ``key_bucket`` as an ordinary column.

Every micro-batch is one Delta commit of the output table (and one of the rejects table, first)
made with `DeltaTable.create_write_transaction`: the add actions of the files the tasks wrote,
the remove actions of the files they replace, the application transaction (``kappa.<pipeline>.v<N>``,
batch id) and custom metadata with the batch's end offsets. `check_replay` makes a replayed batch
a no-op only when the table's commit of that batch id covers the same end offsets; a batch id the
table holds with other offsets means the checkpoint is not the one the table was written from,
and the job refuses to go on (SinkError) rather than skip or duplicate data.

Upkeep (`upkeep`, after a commit): a Delta log checkpoint every `CHECKPOINT_EVERY` commits, the
rejects table compacted when it holds more than `REJECT_FILES_MAX` files, and files no commit
references any more removed once older than the retention (`vacuum_hours`, default 1 h: longer
than any reader of this version holds a snapshot, and the served alias only moves between
versions, never between snapshots of one table).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pyarrow as pa

from jobs.lib.bucketed.tasks import BUCKET_COLUMN, filesystem
from orchestrator.core.exceptions import SinkError

__all__ = ["BUCKETS_KEY", "CHECKPOINT_EVERY", "REJECT_FILES_MAX", "BucketedTable"]

log = logging.getLogger("kappa.bucketed")

BUCKETS_KEY = "buckets"
CHECKPOINT_EVERY = 50
REJECT_FILES_MAX = 32
STAGING = "_kappa_staging"


def _add(a: dict):
    from deltalake.transaction import AddAction

    return AddAction(a["path"], int(a["size"]), a.get("partition_values") or {}, int(a["modification_time"]),
                     True, a.get("stats") or "")


def _remove(a: dict, now_ms: int):
    from deltalake.transaction import RemoveAction

    return RemoveAction(a["path"], True, now_ms, int(a["size"]) if a.get("size") is not None else None,
                        a.get("partition_values") or {})


class BucketedTable:
    """One version's output table (bucketed, upserted) and its rejects table (appended)."""

    def __init__(self, table_uri: str, rejects_uri: str | None, app_id: str, schema: pa.Schema, *,
                 buckets: int, key_column: str = "member_id", metadata: dict | None = None, rejects_schema: pa.Schema | None = None,
                 vacuum_hours: float = 1.0):
        self.table_uri = str(table_uri).rstrip("/")
        self.rejects_uri = str(rejects_uri).rstrip("/") if rejects_uri else None
        self.app_id = app_id
        self.schema = schema
        self.buckets = int(buckets)
        self.key_column = key_column
        self.rejects_schema = rejects_schema
        self.vacuum_hours = float(vacuum_hours)
        self.metadata = {("pipeline_version" if k == "version" else k): str(v)
                         for k, v in (metadata or {}).items() if v is not None}
        self._dt = None
        self._rejects = None
        self.commits = 0

    @property
    def table_schema(self) -> pa.Schema:
        return self.schema.append(pa.field(BUCKET_COLUMN, pa.int32()))

    @property
    def staging_root(self) -> str:
        return f"{self.table_uri}/{STAGING}"

    # -- set-up ----------------------------------------------------------------------------------
    def ensure(self) -> None:
        """Create both tables if missing; adopt the bucket count of an existing table; refuse a
        table of another layout; drop staging left by a crashed run (one job writes a table)."""
        from deltalake import DeltaTable

        if DeltaTable.is_deltatable(self.table_uri):
            dt = DeltaTable(self.table_uri)
            parts = dt.metadata().partition_columns
            recorded = _recorded_buckets(dt.metadata().description)
            if parts != [BUCKET_COLUMN] or recorded is None:
                raise SinkError(f"{self.table_uri} is not a bucketed kappa table (partition columns {parts}): it was "
                                f"written by an older kappa; deploy a new version, which writes a new table")
            if int(recorded) != self.buckets:
                log.warning("%s has %s buckets (the job was given %d): keeping the table's", self.table_uri,
                            recorded, self.buckets)
                self.buckets = int(recorded)
            self._dt = dt
        else:
            self._dt = DeltaTable.create(self.table_uri, self.table_schema, mode="ignore",
                                         partition_by=[BUCKET_COLUMN],
                                         description=json.dumps({"kappa": {BUCKETS_KEY: self.buckets,
                                                                           "key": self.key_column}}))
        if self.rejects_uri is not None and self.rejects_schema is not None:
            self._rejects = DeltaTable.create(self.rejects_uri, self.rejects_schema, mode="ignore")
        fs, root = filesystem(self.staging_root)
        fs.delete_dir_contents(root, missing_dir_ok=True)

    def table(self):
        if self._dt is None:
            self.ensure()
        else:
            self._dt.update_incremental()
        return self._dt

    # -- idempotency -----------------------------------------------------------------------------
    def committed_batch(self) -> int | None:
        return self.table().transaction_version(self.app_id)

    def batch_commit(self, batch_id: int) -> dict | None:
        """The commit info of micro-batch `batch_id` in this table's history, or None."""
        for entry in self.table().history():
            if entry.get("batch_id") == str(batch_id) and entry.get("app_id", self.app_id) == self.app_id:
                return entry
        return None

    def check_replay(self, batch_id: int, end_offsets: dict) -> bool:
        """True: the table already holds this batch with these end offsets (skip it). False: not
        yet written. SinkError: the table holds this batch id with other offsets."""
        done = self.committed_batch()
        if done is None or done < batch_id:
            return False
        entry = self.batch_commit(batch_id)
        if entry is None:  # history cleaned up: the table's latest end offsets must cover ours
            recorded = None
            latest = self.latest_end_offsets()
            if latest is not None and _covers(latest, end_offsets):
                return True
        else:
            recorded = json.loads(entry["end_offsets"]) if entry.get("end_offsets") else None
            if recorded == _canonical(end_offsets):
                return True
        raise SinkError(
            f"{self.table_uri} already holds micro-batch {batch_id} (up to batch {done}) read to offsets "
            f"{json.dumps(recorded, sort_keys=True) if recorded else 'unknown'}, but this query's batch {batch_id} "
            f"ends at {json.dumps(_canonical(end_offsets), sort_keys=True)}: the checkpoint is not the one the table "
            f"was written from. Restore the version's checkpoint, or deploy a new version (new table, new checkpoint)")

    def latest_end_offsets(self) -> dict | None:
        for entry in self.table().history(10):
            if entry.get("end_offsets"):
                return json.loads(entry["end_offsets"])
        return None

    # -- layout ----------------------------------------------------------------------------------
    def current_files(self, buckets: set[int]) -> dict[int, list[dict]]:
        """{bucket: [{path, size, partition_values}]} of the table's live files in `buckets`."""
        actions = pa.table(self.table().get_add_actions(flatten=True))
        out: dict[int, list[dict]] = {b: [] for b in buckets}
        if actions.num_rows == 0:
            return out
        col = f"partition.{BUCKET_COLUMN}"
        for path, size, b in zip(actions["path"].to_pylist(), actions["size_bytes"].to_pylist(),
                                 actions[col].to_pylist()):
            if b is not None and int(b) in out:
                out[int(b)].append({"path": path, "size": size, "partition_values": {BUCKET_COLUMN: str(b)}})
        return out

    def file_count(self) -> int:
        return len(self.table().file_uris())

    # -- commits ---------------------------------------------------------------------------------
    def _properties(self, batch_id: int, end_offsets: dict | None, extra: dict | None = None):
        from deltalake import CommitProperties, Transaction

        meta = {**self.metadata, "batch_id": str(batch_id), "app_id": self.app_id, **(extra or {})}
        if end_offsets is not None:
            meta["end_offsets"] = json.dumps(_canonical(end_offsets), sort_keys=True, separators=(",", ":"))
        return CommitProperties(custom_metadata=meta, app_transactions=[Transaction(self.app_id, batch_id)])

    def commit_rejects(self, batch_id: int, adds: list[dict]) -> int:
        """The batch's reject files, once (the rejects table's own app transaction)."""
        if self.rejects_uri is None or not adds:
            return 0
        dt = self._rejects
        dt.update_incremental()
        done = dt.transaction_version(self.app_id)
        if done is not None and done >= batch_id:
            return 0
        try:
            dt.create_write_transaction([_add(a) for a in adds], mode="append", schema=self.rejects_schema,
                                        commit_properties=self._properties(batch_id, None))
        except Exception as e:
            raise SinkError(f"committing {len(adds)} reject files of micro-batch {batch_id} to {self.rejects_uri} "
                            f"failed: {e}") from e
        return sum(int(a.get("rows") or 0) for a in adds)

    def commit(self, batch_id: int, adds: list[dict], removes: list[dict], end_offsets: dict,
               extra: dict | None = None) -> int:
        """One Delta commit of the output table: the batch's adds and removes, its app transaction
        and end offsets. Returns the new table version."""
        now = int(time.time() * 1000)
        actions = [_add(a) for a in adds] + [_remove(r, now) for r in removes]
        dt = self.table()
        try:
            dt.create_write_transaction(actions, mode="append", schema=self.table_schema, partition_by=[BUCKET_COLUMN],
                                        commit_properties=self._properties(batch_id, end_offsets, extra))
        except Exception as e:
            raise SinkError(f"committing micro-batch {batch_id} to {self.table_uri} failed: {e}") from e
        self.commits += 1
        dt.update_incremental()
        return dt.version()

    def drop_staging(self, staging_uri: str) -> None:
        fs, root = filesystem(staging_uri)
        try:
            fs.delete_dir(root)
        except FileNotFoundError:
            pass

    # -- upkeep ----------------------------------------------------------------------------------
    def upkeep(self, *, force: bool = False) -> dict[str, Any]:
        """Log checkpoint, rejects compaction and vacuum when due (see the module)."""
        done: dict[str, Any] = {}
        dt = self.table()
        if force or (dt.version() and dt.version() % CHECKPOINT_EVERY == 0):
            dt.create_checkpoint()
            dt.cleanup_metadata()
            done["checkpoint"] = dt.version()
            done["vacuumed"] = len(dt.vacuum(retention_hours=int(self.vacuum_hours), dry_run=False,
                                             enforce_retention_duration=False))
            if self._rejects is not None:
                self._rejects.update_incremental()
                if len(self._rejects.file_uris()) > REJECT_FILES_MAX:
                    done["rejects_compacted"] = self._rejects.optimize.compact().get("numFilesRemoved")
                self._rejects.vacuum(retention_hours=int(self.vacuum_hours), dry_run=False,
                                     enforce_retention_duration=False)
        if done:
            log.info("table upkeep of %s: %s", self.table_uri, done)
        return done


def _recorded_buckets(description: str | None) -> int | None:
    """The bucket count a kappa table records in its description, or None."""
    try:
        return int(json.loads(description or "")["kappa"][BUCKETS_KEY])
    except (ValueError, KeyError, TypeError):
        return None


def _canonical(offsets: dict) -> dict:
    return {str(t): {str(p): int(o) for p, o in sorted(parts.items(), key=lambda kv: int(kv[0]))}
            for t, parts in sorted(offsets.items())}


def _covers(recorded: dict, offsets: dict) -> bool:
    for t, parts in offsets.items():
        for p, o in parts.items():
            if int(o) > int(recorded.get(t, {}).get(str(p), -1)):
                return False
    return True
