"""Idempotent Delta writes from `foreachBatch`, with delta-spark.

Runs on the driver, inside the foreachBatch function; the data stays in Spark. Every commit carries
Delta's application transaction (``txnAppId`` = `kappa.<pipeline>.v<N>`, ``txnVersion`` = the
micro-batch id, set through the session settings that DML reads too) and, as ``userMetadata``, a
JSON object with the pipeline, its version, the rules hash, the batch id and the batch's end
offsets from Spark's offset log. Spark commits a micro-batch to its checkpoint only after
foreachBatch returns, so a crash in between replays the batch on restart: Delta skips a write whose
transaction version it has already committed, and `committed(batch_id)` asks the output table first,
so a replayed batch costs nothing.

Rejects are written first (an append to the rejects table), the output second (the first batch into
an empty table an append, every later one a MERGE: tombstones delete, the rest update or insert),
each with its own transaction, so a crash between the two does not write the rejects twice.

`upsert` gets the latest record per key by the table's key order (`KEY_ORDERS`; the runner's
`jobs.lib.contract.runner.group_batch` keeps it): within a Kafka partition the higher offset wins; a key seen
in two partitions has no order Kafka defines, so under ``partition`` (default) the batch is refused
with the keys named (found in the batch by the runner, or against the partition the table holds for
it by the MERGE), and under ``timestamp`` records order by (record timestamp, partition, offset),
against the table's row too, so a stale value from another partition never wins.

Test hooks, for tests that force a crash window instead of racing it:
``KAPPA_TEST_PAUSE_AT=<point>:<batch id>`` with ``KAPPA_TEST_PAUSE_FILE=<path>``: at ``read`` (the
batch read, parsed and counted, nothing written) or ``commit`` (the rejects committed, the output
not) the job writes the file and waits there for ever, for the test to kill it. ``KAPPA_TEST_CRASH_AFTER_COMMIT=<batch id>``: the process dies right after that
batch's Delta commits, before Spark records it in the checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterator

from jobs.lib.runtime.session import session_settings
from orchestrator.core.exceptions import SinkError

__all__ = ["KEY_ORDERS", "TABLE_ORDER", "key_order_columns", "MAX_CONFLICTS", "LOCAL_SOURCE_ROWS", "PAUSE_HOOK", "PAUSE_FILE", "CRASH_HOOK", "DeltaTables", "REJECTS_DDL", "clear_torn_create", "nullable",
           "batch_end_offsets", "pause_if_asked", "crash_if_asked"]

log = logging.getLogger("kappa.sink")

KEY_ORDERS = ("partition", "timestamp")
PAUSE_HOOK = "KAPPA_TEST_PAUSE_AT"
PAUSE_FILE = "KAPPA_TEST_PAUSE_FILE"
CRASH_HOOK = "KAPPA_TEST_CRASH_AFTER_COMMIT"
#: Keys named in a key-order refusal, at most.
MAX_CONFLICTS = 5

#: The rejects table's columns: the raw record, where it is in the log, why it was refused, the micro-batch
#: (every job's, `jobs.lib.contract.runner.batch_rejects` and `jobs.lib.runtime.seedjob.SeedBatches`).
REJECTS_DDL = ("key binary, value binary, topic string, partition int, offset bigint, error string, "
               "batch_id bigint")
_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def pause_if_asked(point: str, batch_id: int) -> None:
    """The pause hook (see the module): stop here for ever if the environment asks for it."""
    want = os.environ.get(PAUSE_HOOK)
    if not want or want != f"{point}:{batch_id}":
        return
    path = os.environ.get(PAUSE_FILE)
    log.error("%s=%s: pausing at %s of micro-batch %d until killed", PAUSE_HOOK, want, point, batch_id)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
    while True:
        time.sleep(1)


def crash_if_asked(batch_id: int) -> None:
    """The crash hook (see the module): die at once after this batch's commits."""
    if os.environ.get(CRASH_HOOK) == str(batch_id):
        log.error("%s=%s: dying after the Delta commit of micro-batch %d", CRASH_HOOK, batch_id, batch_id)
        logging.shutdown()
        os._exit(137)


def batch_end_offsets(checkpoint: str | Path, batch_id: int) -> dict | None:
    """The end offsets Spark planned for `batch_id` ({topic: {partition: offset}}), from the offset log
    it writes before the batch runs; None if the checkpoint has no such entry."""
    path = Path(checkpoint) / "offsets" / str(batch_id)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    merged: dict[str, dict[str, int]] = {}
    for line in lines[2:]:       # "v1", the batch's metadata, then one line per source
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            for topic, parts in doc.items():
                if isinstance(parts, dict):
                    merged.setdefault(topic, {}).update({str(p): int(o) for p, o in parts.items()})
    return merged or None


#: The columns that order a key's records, by their names in the table (`key_order_columns`).
TABLE_ORDER = ("source_timestamp", "source_partition", "source_offset")


def key_order_columns(prefix: str, key_order: str, names: tuple[str, str, str] = TABLE_ORDER) -> list[Any]:
    """The key order as columns to compare in turn (see the module), a missing value first: (record
    timestamp,) partition, offset, named `names` (timestamp, partition, offset) after `prefix`."""
    from pyspark.sql import functions as F

    cols = list(names if key_order == "timestamp" else names[1:])
    return [F.coalesce(F.col(f"{prefix}{c}").cast("long"), F.lit(-2**62)) for c in cols]


def _key_filter(alias: str, key: str, values: list) -> str | None:
    """``alias.key IN (...)`` over the batch's keys as SQL literals (None for keys of other types): a
    condition on the table alone, which Spark pushes into the MERGE's scans of the table, so that its
    joins see the rows of the batch's keys only instead of shuffling the whole table."""
    if not all(v is None or (isinstance(v, (str, int)) and not isinstance(v, bool)) for v in values):
        return None

    def literal(v: str | int) -> str:
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'" if isinstance(v, str) else str(v)
    keys = sorted({literal(v) for v in values if v is not None})
    cond = [f"{alias}.`{key}` IN ({', '.join(keys)})"] if keys else []
    if any(v is None for v in values):
        cond.append(f"{alias}.`{key}` IS NULL")     # the MERGE matches null keys (<=>), IN never does
    return "(" + " OR ".join(cond) + ")"


#: A micro-batch of at most this many rows is MERGEd from the driver's memory (a local relation): Delta
#: then need not materialise the source, and the batch is not read again for each phase of the MERGE.
LOCAL_SOURCE_ROWS = 10_000
_MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"


def nullable(data_type: Any) -> Any:
    """`data_type` with every field, element and value nullable (nested too): the schema Delta gives a table
    that a write creates (its ``asNullable``), for a table created from a DataFrame's schema instead."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if isinstance(data_type, StructType):
        return StructType([StructField(f.name, nullable(f.dataType), True, f.metadata) for f in data_type.fields])
    if isinstance(data_type, ArrayType):
        return ArrayType(nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(nullable(data_type.keyType), nullable(data_type.valueType), True)
    return data_type


def clear_torn_create(session: Any, location: str) -> bool:
    """Delete the `_delta_log` of `location` if it holds no commit (no non-empty commit or checkpoint file):
    what a table's create cut short leaves (a full disk), which Delta then takes for a table it cannot find.
    True when it deleted one; a log with any commit is a table's, never touched."""
    jvm = session._jvm
    log_dir = jvm.org.apache.hadoop.fs.Path(location.rstrip("/") + "/_delta_log")
    fs = log_dir.getFileSystem(session._jsc.hadoopConfiguration())
    if not fs.exists(log_dir):
        return False
    for status in fs.listStatus(log_dir):
        name = status.getPath().getName()
        if not name.startswith(".") and name.endswith((".json", ".parquet")) and status.getLen() > 0:
            return False
    return bool(fs.delete(log_dir, True))


class DeltaTables:
    """The output and rejects tables of one pipeline version, written from foreachBatch.

    `key` names the output's key column(s). With a `key_order` the rows carry their source record's
    position (``source_partition``, ``source_offset``, ``source_timestamp``) and the order rule of the
    module applies; with None (a stateful job's output: one row per key and batch, already the
    latest) a batch's row replaces the table's."""

    def __init__(self, table_uri: str, rejects_uri: str | None, app_id: str, key: str | list[str], *,
                 key_order: str | None = "partition", metadata: dict | None = None, checkpoint: str | None = None):
        if key_order is not None and key_order not in KEY_ORDERS:
            raise SinkError(f"key_order must be one of {', '.join(KEY_ORDERS)}, got {key_order!r}")
        self.table_uri = str(table_uri)
        self.rejects_uri = str(rejects_uri) if rejects_uri else None
        self.app_id = app_id
        self.keys = [key] if isinstance(key, str) else list(key)
        if key_order is not None and len(self.keys) != 1:
            raise SinkError(f"a key order needs one key column (the record key), got {self.keys}")
        self.key = self.keys[0]
        self.key_order = key_order
        self.metadata = dict(metadata or {})
        self.checkpoint = checkpoint
        self._rejects_readable = False      # the rejects table was read once by this process

    @property
    def rejects_found(self) -> bool:
        """Whether this process found (or made) the rejects table readable already."""
        return self._rejects_readable

    # -- reading the tables' transaction state ---------------------------------------------------
    def _txn_version(self, uri: str) -> int | None:
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(uri):
            return None
        return DeltaTable(uri).transaction_version(self.app_id)

    def committed(self, batch_id: int) -> bool:
        """Whether the output table holds this batch already (a replay after a crash). SinkError if it
        holds a batch of that id planned with other end offsets: the table was written from another
        checkpoint, and skipping by id would lose records, writing would apply some twice."""
        done = self._txn_version(self.table_uri)
        if done is None or done < batch_id:
            return False
        ours = batch_end_offsets(self.checkpoint, batch_id) if self.checkpoint else None
        theirs = self._recorded_end_offsets(batch_id)
        if ours is not None and theirs is not None and ours != theirs:
            raise SinkError(
                f"the table {self.table_uri} already holds micro-batch {batch_id} with end offsets {theirs}, but "
                f"this query planned it to end at {ours}: the checkpoint is not the one the table was written from. "
                f"Restart from the table's checkpoint, or deploy a new version")
        return True

    def _recorded_end_offsets(self, batch_id: int) -> dict | None:
        """The end offsets the output table's commit of `batch_id` recorded (its userMetadata)."""
        from deltalake import DeltaTable

        for h in DeltaTable(self.table_uri).history():
            try:
                meta = json.loads(h.get("userMetadata") or "{}")
            except ValueError:
                continue
            if isinstance(meta, dict) and meta.get("batch_id") == batch_id:
                return meta.get("end_offsets")
        return None

    def exists(self, uri: str | None = None) -> bool:
        """Whether the output table (or the table at `uri`) exists."""
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(uri or self.table_uri)

    @staticmethod
    def _readable(uri: str) -> bool:
        """Whether a table at `uri` can be read: not only a log (a create a full disk cut short leaves a
        commit file with nothing in it, which a look at the log alone takes for a table)."""
        from deltalake import DeltaTable

        try:
            DeltaTable(uri)
        except Exception:  # noqa: BLE001 - no table, or no readable one: the caller creates it
            return False
        return True

    @contextlib.contextmanager
    def _transaction(self, session: Any, batch_id: int) -> Iterator[None]:
        """Delta's idempotent-write settings and the commit's metadata for one write, in `session`: the
        micro-batch's own (foreachBatch hands a clone of the query's session)."""
        meta = {**self.metadata, "batch_id": batch_id}
        if self.checkpoint:
            meta["end_offsets"] = batch_end_offsets(self.checkpoint, batch_id)
        with session_settings(session, {_TXN_APP: self.app_id, _TXN_VERSION: str(batch_id),
                                        _USER_METADATA: json.dumps(meta, sort_keys=True, separators=(",", ":"))}):
            yield

    # -- writing ----------------------------------------------------------------------------------
    def ensure_rejects(self, session: Any, schema: Any) -> None:
        """Create the rejects table empty, with `schema` (a StructType), if this process has not found it
        readable yet: readers always find it, even before a batch has any rejects.

        It is created without a write (a metadata commit; an empty write ran a Spark job, 2.4 s more), with
        the schema a write gives a new table: every column nullable (a batch's ``batch_id`` literal is not
        null, and the table's schema then depended on whether the first batch had rejects). The first
        batch of a job process calls this on a thread of its own while the batch is read
        (`jobs.lib.sink.batches.MicroBatches`): the create is a JVM's first Delta commit, 1.8-2.2 s of
        the backfill's critical path when it came after the read."""
        from delta.tables import DeltaTable

        if self.rejects_uri is None or self._rejects_readable:
            return
        if not self._readable(self.rejects_uri):
            # Delta compares the location with the table's identifier in Hadoop's form: given
            # `file:///x` it would see `file:/x` and refuse the two as different locations
            location = session._jvm.org.apache.hadoop.fs.Path(self.rejects_uri).toString()
            columns = nullable(schema)

            def create() -> None:
                DeltaTable.createIfNotExists(session).location(location).addColumns(columns).execute()

            try:
                create()
            except Exception:
                # a create cut short (a full disk) leaves a log with no readable commit, which Delta
                # then takes for a table it cannot find or read: clear that log, never one with a commit
                if not clear_torn_create(session, location):
                    raise
                log.warning("rejects table %s: cleared the log a create cut short left, creating it again", location)
                create()
        self._rejects_readable = True

    def write_rejects(self, batch_id: int, rejects: Any, count: int) -> None:
        """Append the batch's rejects (the table created empty first, `ensure_rejects`, so readers always
        find it).

        A batch with none (`count` 0) commits nothing once the table exists: each commit under a
        transaction identifier costs Delta a reconstruction of the table's state (about a second
        here) to check it, and a replay of such a batch finds nothing to write either."""
        if self.rejects_uri is None:
            return
        if count == 0:
            self.ensure_rejects(rejects.sparkSession, rejects.schema)
            return
        done = self._txn_version(self.rejects_uri)
        if done is not None and done >= batch_id:
            return
        with self._transaction(rejects.sparkSession, batch_id):
            rejects.write.format("delta").mode("append").save(self.rejects_uri)

    def refuse(self, batch_id: int, conflicts: list[str]) -> None:
        raise SinkError(
            f"micro-batch {batch_id}: key(s) found in more than one Kafka partition, whose order Kafka does not "
            f"define: {', '.join(conflicts)}. Fix the producers' partitioner, or set key_order = \"timestamp\" in "
            f"the pipeline's options to order such records by timestamp, then partition, then offset")

    def upsert(self, batch_id: int, latest: Any, deleted: str, *, rows: int | None = None) -> None:
        """Write one row per touched key (`latest`, `rows` of them, with the boolean column `deleted`).

        Into a table that does not exist yet (a version's backfill) a plain append of the rows that are
        not deletes; nothing for a batch with no rows; otherwise a MERGE (tombstones delete, the rest
        update or insert). A batch of at most `LOCAL_SOURCE_ROWS` rows is collected to the driver and
        MERGEd from there: Delta reads a local relation without materialising it first, and every phase
        of the MERGE joins the table with it without reading the batch again. Under key order
        ``partition`` the MERGE's first clause fails it (``raise_error``, so nothing is committed) on a
        key whose row in the table came from another partition: the refusal costs no extra read of the
        table."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        if rows == 0:
            return
        columns = [c for c in latest.columns if c != deleted]
        session = latest.sparkSession
        with self._transaction(session, batch_id):
            if not self.exists():
                latest.where(~F.col(deleted)).select(*columns).write.format("delta").mode("append") \
                    .save(self.table_uri)
                return
            local = rows is not None and rows <= LOCAL_SOURCE_ROWS
            on = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in self.keys)
            source = latest
            if local:
                batch = latest.collect()
                source = session.createDataFrame(batch, latest.schema)
                keys = _key_filter("t", self.key, [r[self.key] for r in batch]) if len(self.keys) == 1 else None
                on = f"({on}) AND {keys}" if keys else on
            later = F.lit(True)
            merge = DeltaTable.forPath(session, self.table_uri).alias("t").merge(source.alias("s"), on)
            if self.key_order == "timestamp":
                later = (F.struct(*key_order_columns("s.", "timestamp"))
                         > F.struct(*key_order_columns("t.", "timestamp")))
            elif self.key_order == "partition":
                moved = F.concat(F.lit(_MOVED), F.col(f"s.`{self.key}`").cast("string"), F.lit(" (partition "),
                                 F.col("t.source_partition").cast("string"), F.lit(" in the table, "),
                                 F.col("s.source_partition").cast("string"), F.lit(" now)"))
                merge = merge.whenMatchedUpdate(condition=F.col("t.source_partition") != F.col("s.source_partition"),
                                                set={self.key: F.raise_error(moved).cast("string")})
            merge = (merge.whenMatchedDelete(condition=F.col(f"s.{deleted}") & later)
                     .whenMatchedUpdate(condition=~F.col(f"s.{deleted}") & later,
                                        set={c: F.col(f"s.`{c}`") for c in columns})
                     .whenNotMatchedInsert(condition=~F.col(f"s.{deleted}"),
                                           values={c: F.col(f"s.`{c}`") for c in columns}))
            try:
                with session_settings(session, {_MATERIALIZE_SOURCE: "none" if local else None}):
                    merge.execute()
            except Exception as e:
                text = str(e)
                if _MOVED not in text:
                    raise
                self.refuse(batch_id, [text.split(_MOVED, 1)[1].split(")", 1)[0] + ")"])

    def append(self, batch_id: int, rows: Any) -> None:
        """Append the batch's rows (an append-only output: joined events, closed windows)."""
        with self._transaction(rows.sparkSession, batch_id):
            rows.write.format("delta").mode("append").save(self.table_uri)


#: Marks the MERGE's refusal of a key that moved partitions, so `upsert` can name the key.
_MOVED = "kappa: key moved partitions: "
