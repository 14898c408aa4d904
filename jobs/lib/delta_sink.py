"""Idempotent Delta writes for micro-batches, with delta-rs (`deltalake`), from `foreachBatch`.

Runs on the driver, inside the foreachBatch function. Every commit carries an application
transaction (app id = `kappa.<pipeline>.v<N>`, version = the micro-batch id) and custom metadata
(pipeline, pipeline_version, rules_hash, batch_id, end_offsets: the micro-batch's end offsets as
JSON). Spark commits a
micro-batch to its checkpoint only after foreachBatch returns, so a crash in between replays the
batch on restart: `committed(batch_id)` answers from the table's transaction log, and a batch
already there is skipped before any work is done.

The rejects table gets its own transaction with the same app id, so a crash between the rejects
commit and the output commit does not write the rejects twice. The job writes rejects first,
output second, and checks `committed` against the output table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.core.exceptions import SinkError

__all__ = ["DELETED", "REJECTS_SCHEMA", "WriteResult", "DeltaSink", "count_rows", "read_table", "latest_per_key"]

#: The boolean column of an upsert's input that marks a key to delete (never written to the table).
DELETED = "_deleted"

REJECTS_SCHEMA = pa.schema([
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("error", pa.string()),
    ("batch_id", pa.int64()),
])


@dataclass(frozen=True)
class WriteResult:
    batch_id: int
    skipped: bool          # the batch was already committed
    operation: str         # "append", "merge", "skip", "none"
    rows: int              # rows given to the write
    version: int | None    # table version after the write
    metrics: dict | None = None


def _exists(uri: str) -> bool:
    from deltalake import DeltaTable

    return DeltaTable.is_deltatable(str(uri))


def count_rows(uri: str | Path) -> int:
    """Exact row count of a Delta table, from Parquet footers; 0 if there is no table at `uri` yet."""
    from deltalake import DeltaTable

    if not _exists(str(uri)):
        return 0
    return DeltaTable(str(uri)).to_pyarrow_dataset().count_rows()


def read_table(uri: str | Path, columns: list[str] | None = None) -> pa.Table:
    """The current content of a Delta table; SinkError if there is no table at `uri`."""
    from deltalake import DeltaTable

    if not _exists(str(uri)):
        raise SinkError(f"no Delta table at {uri}: has the job written its first micro-batch yet?")
    return DeltaTable(str(uri)).to_pyarrow_table(columns=columns)


def latest_per_key(table: pa.Table, key_columns: list[str], order_column: str) -> pa.Table:
    """Rows with the highest `order_column` for each key (the latest offset wins)."""
    if table.num_rows <= 1:
        return table
    order = pc.sort_indices(table[order_column])
    keyed = pa.table({**{c: table[c].take(order) for c in key_columns}, "__row": order})
    winners = keyed.group_by(key_columns, use_threads=False).aggregate([("__row", "last")])
    if winners.num_rows == table.num_rows:
        return table
    rows = winners["__row_last"]
    return table.take(rows.take(pc.sort_indices(rows)))


class DeltaSink:
    """Upserts, appends and rejects of one pipeline version, one micro-batch at a time."""

    def __init__(self, table_uri: str | Path, rejects_uri: str | Path | None, app_id: str,
                 metadata: dict | None = None):
        self.table_uri = str(table_uri)
        self.rejects_uri = str(rejects_uri) if rejects_uri else None
        self.app_id = app_id
        # Delta's history() reports each commit's table version under "version", hiding a custom
        # key of that name: the pipeline version is stored as "pipeline_version".
        self.metadata = {("pipeline_version" if k == "version" else k): str(v)
                         for k, v in (metadata or {}).items() if v is not None}
        self._table = None
        self._rejects = None

    # -- tables --------------------------------------------------------------------------------
    def _load(self, uri: str, cached):
        from deltalake import DeltaTable

        if cached is not None:
            cached.update_incremental()
            return cached
        if not _exists(uri):
            return None
        return DeltaTable(uri)

    def table(self):
        """The output DeltaTable (refreshed), or None before the first commit."""
        self._table = self._load(self.table_uri, self._table)
        return self._table

    def committed(self, batch_id: int) -> bool:
        """True if the output table already holds this micro-batch (or a later one)."""
        dt = self.table()
        if dt is None:
            return False
        done = dt.transaction_version(self.app_id)
        return done is not None and done >= batch_id

    def _properties(self, batch_id: int, end_offsets: dict | None, extra: dict | None = None):
        from deltalake import CommitProperties, Transaction

        meta = {**self.metadata, "batch_id": str(batch_id), **(extra or {})}
        if end_offsets is not None:
            meta["end_offsets"] = json.dumps(end_offsets, sort_keys=True, separators=(",", ":"))
        return CommitProperties(custom_metadata=meta, app_transactions=[Transaction(self.app_id, batch_id)])

    # -- writes --------------------------------------------------------------------------------
    def append(self, batch_id: int, table: pa.Table, end_offsets: dict | None = None) -> WriteResult:
        """Append rows as one idempotent commit (an empty table still commits the transaction)."""
        from deltalake import write_deltalake

        if self.committed(batch_id):
            return WriteResult(batch_id, True, "skip", 0, self._table.version())
        try:
            write_deltalake(self.table_uri, table, mode="append",
                            commit_properties=self._properties(batch_id, end_offsets))
        except Exception as e:
            raise SinkError(f"append of micro-batch {batch_id} to {self.table_uri} failed: {e}") from e
        dt = self.table()
        return WriteResult(batch_id, False, "append", table.num_rows, dt.version())

    def upsert(self, batch_id: int, table: pa.Table, key_columns: list[str],
               deleted_column: str = DELETED, end_offsets: dict | None = None,
               order_column: str | None = None) -> WriteResult:
        """Merge a micro-batch by key: latest row per key wins, rows flagged `deleted_column` delete.

        `table` holds the output columns plus the boolean `deleted_column`. With `order_column`
        (e.g. the source offset) duplicate keys are reduced to the highest; without it the
        table must already hold one row per key. Into a table without rows this is an append.
        """
        from deltalake import write_deltalake

        if self.committed(batch_id):
            return WriteResult(batch_id, True, "skip", 0, self._table.version())
        if deleted_column not in table.column_names:
            raise SinkError(f"upsert of micro-batch {batch_id}: column {deleted_column!r} missing from "
                            f"{table.column_names}")
        if order_column is not None:
            table = latest_per_key(table, key_columns, order_column)
        deleted = pc.fill_null(table[deleted_column], False)
        props = self._properties(batch_id, end_offsets)
        dt = self._table
        try:
            if dt is None or _is_empty(dt):
                live = table.filter(pc.invert(deleted)).drop_columns([deleted_column])
                write_deltalake(self.table_uri, live, mode="append", commit_properties=props)
                op, metrics = "append", None
            else:
                _check_columns(dt, self.table_uri, [c for c in table.column_names if c != deleted_column], batch_id)
                predicate = " AND ".join(f"t.`{c}` = s.`{c}`" for c in key_columns)
                src = table.set_column(table.schema.get_field_index(deleted_column), deleted_column, deleted)
                metrics = (
                    dt.merge(src, predicate, source_alias="s", target_alias="t", commit_properties=props)
                    .when_matched_delete(f"s.`{deleted_column}`")
                    .when_matched_update_all(f"NOT s.`{deleted_column}`", except_cols=[deleted_column])
                    .when_not_matched_insert_all(f"NOT s.`{deleted_column}`", except_cols=[deleted_column])
                    .execute()
                )
                op = "merge"
        except SinkError:
            raise
        except Exception as e:
            raise SinkError(f"upsert of micro-batch {batch_id} into {self.table_uri} failed: {e}") from e
        dt = self.table()
        return WriteResult(batch_id, False, op, table.num_rows, dt.version(), metrics)

    def write_rejects(self, batch_id: int, rejects: pa.Table) -> WriteResult:
        """Append the batch's rejects to the rejects table, once (own app transaction).

        The rejects table is created, empty, on the first call, so that its count reads 0
        rather than missing. A batch without rejects commits nothing.
        """
        from deltalake import DeltaTable, write_deltalake

        if self.rejects_uri is None:
            raise SinkError("this sink has no rejects table; give DeltaSink a rejects_uri")
        if self._rejects is None and not _exists(self.rejects_uri):
            DeltaTable.create(self.rejects_uri, REJECTS_SCHEMA, mode="ignore")
        self._rejects = self._load(self.rejects_uri, self._rejects)
        done = self._rejects.transaction_version(self.app_id)
        if done is not None and done >= batch_id:
            return WriteResult(batch_id, True, "skip", 0, self._rejects.version())
        if rejects.num_rows == 0:
            return WriteResult(batch_id, False, "none", 0, self._rejects.version())
        rejects = rejects.select(REJECTS_SCHEMA.names).cast(REJECTS_SCHEMA)
        try:
            write_deltalake(self.rejects_uri, rejects, mode="append",
                            commit_properties=self._properties(batch_id, None))
        except Exception as e:
            raise SinkError(f"writing {rejects.num_rows} rejects of micro-batch {batch_id} to "
                            f"{self.rejects_uri} failed: {e}") from e
        self._rejects.update_incremental()
        return WriteResult(batch_id, False, "append", rejects.num_rows, self._rejects.version())


def _check_columns(dt, uri: str, columns: list[str], batch_id: int) -> None:
    """A merge would silently null a missing column and drop an extra one: refuse both."""
    target = [f.name for f in dt.schema().fields]
    if sorted(target) != sorted(columns):
        missing = sorted(set(target) - set(columns))
        extra = sorted(set(columns) - set(target))
        raise SinkError(f"micro-batch {batch_id} does not fit {uri}: columns missing {missing}, "
                        f"extra {extra}; the job's output schema changed, so write a new version to a new table")


def _is_empty(dt) -> bool:
    return len(dt.file_uris()) == 0

