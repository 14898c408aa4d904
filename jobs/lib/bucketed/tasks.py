"""The two kinds of Spark task of a keyed upsert: read-transform-stage, then merge-a-bucket.

Both run on executors, in the Python worker, and return only small dicts (file paths, counts,
seconds) to the driver; the records never cross into the JVM or reach the driver.

1. `stage_piece`, one task per offset range (`jobs.lib.kafka.ranges`): reads the range with the
   Kafka source's own reader, applies the job's transform (`spec.transform`: Arrow in, one row
   per touched key plus `_deleted`, and rejects out), writes the rows as one Arrow IPC file per
   output bucket into the batch's staging directory and the rejects as one Parquet data file into
   the rejects table (committed later by the driver, or never, in which case vacuum removes it).
   Staged file names are a function of the range, so a retried task overwrites its own files.
   A backfill's tasks (``spec.progress`` set) report the offset they have read up to while they
   read, through the Kafka reader (`jobs.lib.kafka.progress.RangeReport`).
2. `merge_bucket`, one task per bucket the batch touches: the staged rows of the bucket, latest
   per key by the table's key order (`KeyOrder`), merged with the bucket's current data file(s):
   touched keys replaced or deleted, the rest kept; written as one new data file sorted by key.
   Returns the add action and the files it replaces.

Key order: within one Kafka partition the higher offset wins (the log's order). A key seen in
two partitions (partitions added, producers with different partitioners) has no order Kafka
defines: under ``key_order = "partition"`` (default) the batch is refused with the keys named;
under ``"timestamp"`` records are ordered by (record timestamp, partition, offset), against the
row already in the table too, so a stale value from another partition never wins.
"""

from __future__ import annotations

import json
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.core import uris

__all__ = ["BUCKET_COLUMN", "KEY_ORDERS", "StageSpec", "bucket_of", "staged_path", "stage_piece",
           "merge_bucket", "file_stats", "filesystem", "write_parquet"]

BUCKET_COLUMN = "key_bucket"
KEY_ORDERS = ("partition", "timestamp")
DELETED = "_deleted"
MAX_CONFLICTS = 5


def filesystem(uri: str):
    """(pyarrow FileSystem, path inside it) for a table location: a local path or any URI pyarrow
    knows (file://, s3://, gs://, hdfs://...); `orchestrator.core.uris.filesystem`, which the
    orchestrator opens the same locations with."""
    return uris.filesystem(uri)


def bucket_of(keys: pa.Array, buckets: int) -> np.ndarray:
    """Bucket of every key: CRC-32 of its UTF-8 bytes modulo `buckets` (stable everywhere)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    crc = zlib.crc32
    return np.fromiter((crc(k.encode("utf-8")) % buckets for k in keys.to_pylist()), dtype=np.int32,
                       count=len(keys))


@dataclass(frozen=True)
class StageSpec:
    """What every task of one micro-batch needs; pickled to the executors with the task."""

    table_uri: str
    rejects_uri: str | None
    staging_uri: str
    batch_id: int
    buckets: int
    key_column: str
    settings: Any                                   # SourceSettings of the Kafka source
    transform: Callable[[pa.Table, int], Any]        # Arrow records -> BatchResult-like
    output_schema: pa.Schema                         # the table's columns, without the bucket column
    key_order: str = "partition"
    hold_from: int | None = None                     # test hook: tasks from this index on wait
    progress: str | None = None                      # where read progress goes (the backfill's), or None
    nonce: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


def staged_path(staging_uri: str, bucket: int, topic: str, partition: int, start: int) -> str:
    return f"{staging_uri}/{bucket}/{topic}-{partition}-{start}.arrow"


def _write_ipc(fs, path: str, table: pa.Table) -> None:
    parent = path.rsplit("/", 1)[0]
    fs.create_dir(parent, recursive=True)
    with fs.open_output_stream(path) as out, pa.ipc.new_file(out, table.schema) as w:
        w.write_table(table)


def _inside(root_uri: str, root: str, location: str) -> str:
    """The path, inside the filesystem of `root_uri` (whose own path there is `root`), of `location`,
    a location under `root_uri` (`staged_path(spec.staging_uri, ...)`): a URI is never a path."""
    base, loc = uris.normalize(root_uri), uris.normalize(location)
    if not loc.startswith(base + "/"):
        raise ValueError(f"the staged file {location} is not under the staging folder {root_uri}")
    return root + loc[len(base):]


def _read_ipc(fs, path: str) -> pa.Table:
    with fs.open_input_file(path) as f:
        return pa.ipc.open_file(f).read_all()


def write_parquet(uri: str, relative: str, table: pa.Table, partition_values: dict | None = None,
                  stats_columns: tuple[str, ...] = ()) -> dict:
    """Write `table` to `<uri>/<relative>` and return the Delta add action for it, as a dict."""
    import pyarrow.parquet as pq

    fs, root = filesystem(uri)
    path = f"{root}/{relative}"
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    pq.write_table(table, path, filesystem=fs, compression="snappy", write_statistics=True)
    size = fs.get_file_info(path).size
    return {"path": relative, "size": int(size), "partition_values": dict(partition_values or {}),
            "modification_time": int(time.time() * 1000), "stats": file_stats(table, stats_columns),
            "rows": table.num_rows}


def _stat_value(v):
    if v is None:
        return None
    if hasattr(v, "isoformat"):
        return v.isoformat().replace("+00:00", "Z")
    return v


def file_stats(table: pa.Table, columns: tuple[str, ...]) -> str:
    """Delta column statistics (numRecords, minValues, maxValues, nullCount) so readers can prune."""
    mins, maxs, nulls = {}, {}, {}
    for c in columns:
        if c not in table.column_names:
            continue
        col = table[c]
        nulls[c] = int(col.null_count)
        if table.num_rows and col.null_count < table.num_rows:
            mm = pc.min_max(col)
            mins[c], maxs[c] = _stat_value(mm["min"].as_py()), _stat_value(mm["max"].as_py())
    return json.dumps({"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
                      separators=(",", ":"))


def _hold() -> None:
    """The crash tests' hook: wait until the job's process is gone (SIGKILL), then leave."""
    import os

    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(1)


def stage_piece(spec: StageSpec, indexed: tuple) -> dict:
    """Task 1 (see the module): one offset range read, transformed and staged by bucket."""
    from jobs.lib.kafka.reading import KafkaRange, arrow_schema, read_range

    index, (topic, partition, start, end, new) = indexed
    if spec.hold_from is not None and index >= spec.hold_from:
        _hold()
    t0 = time.perf_counter()
    piece = KafkaRange(topic, int(partition), int(start), int(end), bool(new), progress=spec.progress)
    batches = list(read_range(spec.settings, piece))   # reports its read position (`jobs.lib.kafka.progress`)
    records = pa.Table.from_batches(batches, schema=arrow_schema()) if batches else arrow_schema().empty_table()
    t1 = time.perf_counter()
    result = spec.transform(records.drop_columns(["headers"]), spec.batch_id)
    t2 = time.perf_counter()
    fs, staging = filesystem(spec.staging_uri)
    up = result.upserts
    staged: dict[int, int] = {}
    if up.num_rows:
        buckets = bucket_of(up[spec.key_column], spec.buckets)
        order = np.argsort(buckets, kind="stable")
        sorted_b = buckets[order]
        cuts = np.flatnonzero(np.diff(sorted_b)) + 1
        for idx in np.split(order, cuts):
            b = int(buckets[idx[0]])
            _write_ipc(fs, staged_path(staging, b, topic, partition, start), up.take(pa.array(idx)))
            staged[b] = len(idx)
    reject_add = None
    if result.rejects.num_rows:
        if spec.rejects_uri is None:
            raise ValueError("records were rejected but the job has no rejects table")
        reject_add = write_parquet(spec.rejects_uri,
                                   f"part-{spec.batch_id:08d}-{topic}-{partition}-{start}-{spec.nonce}.parquet",
                                   result.rejects, stats_columns=("partition", "offset", "batch_id"))
    t3 = time.perf_counter()
    return {"topic": topic, "partition": int(partition), "start": int(start), "end": int(end),
            "rows_in": int(result.rows_in), "keys": int(up.num_rows), "tombstones": int(result.tombstones),
            "rejects": int(result.rejects.num_rows), "staged": staged, "reject_add": reject_add,
            "seconds": {"read": t1 - t0, "transform": t2 - t1, "stage": t3 - t2,
                        **{k: float(v) for k, v in getattr(result, "seconds", {}).items()}}}


# --------------------------------------------------------------------------------------------
# Task 2: merge one bucket
# --------------------------------------------------------------------------------------------

def _order_columns(key_order: str) -> list[str]:
    return (["source_timestamp", "source_partition", "source_offset"] if key_order == "timestamp"
            else ["source_partition", "source_offset"])


def _latest(table: pa.Table, key: str, key_order: str) -> pa.Table:
    """One row per key: the last in the key order."""
    if table.num_rows <= 1:
        return table
    cols = _order_columns(key_order)
    order = pa.table({key: table[key], **{c: pc.fill_null(table[c].cast(pa.int64()), -2**62) for c in cols}})
    sort = [(key, "ascending")] + [(c, "ascending") for c in cols]
    table = table.take(pc.sort_indices(order, sort_keys=sort))   # a missing timestamp counts as oldest
    keys = table[key].combine_chunks()
    if len(keys) > 1:
        last = np.ones(len(keys), dtype=bool)
        last[:-1] = pc.not_equal(keys[:-1], keys[1:]).to_numpy(zero_copy_only=False)
        table = table.filter(pa.array(last))
    return table


def _conflicts_within(table: pa.Table, key: str) -> list[str]:
    counts = table.group_by(key).aggregate([("source_partition", "count_distinct")])
    bad = counts.filter(pc.greater(counts["source_partition_count_distinct"], 1))
    return bad[key].to_pylist()[:MAX_CONFLICTS]


def _newer_existing(existing: pa.Table, incoming: pa.Table, key: str) -> pa.Array:
    """Keys of `incoming` whose row in `existing` is later by (timestamp, partition, offset)."""
    cols = ["source_timestamp", "source_partition", "source_offset"]
    e = existing.select([key] + cols).rename_columns([key] + [f"e_{c}" for c in cols])
    i = incoming.select([key] + cols).rename_columns([key] + [f"i_{c}" for c in cols])
    j = e.join(i, key, join_type="inner")
    if j.num_rows == 0:
        return pa.array([], pa.string())
    ets = pc.fill_null(j["e_source_timestamp"].cast(pa.int64()), -2**62)
    its = pc.fill_null(j["i_source_timestamp"].cast(pa.int64()), -2**62)
    ep, ip = j["e_source_partition"], j["i_source_partition"]
    eo, io = j["e_source_offset"], j["i_source_offset"]
    later = pc.or_(pc.greater(ets, its), pc.and_(pc.equal(ets, its), pc.or_(
        pc.greater(ep, ip), pc.and_(pc.equal(ep, ip), pc.greater(eo, io)))))
    return j.filter(later)[key].combine_chunks()


def merge_bucket(spec: StageSpec, bucket: int, staged: list[str], current: list[dict]) -> dict:
    """Task 2 (see the module): one bucket's staged rows merged into its current file(s)."""
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    key = spec.key_column
    sfs, staging = filesystem(spec.staging_uri)
    parts = [_read_ipc(sfs, _inside(spec.staging_uri, staging, p)) for p in staged]
    incoming = pa.concat_tables(parts) if parts else None
    if incoming is None or incoming.num_rows == 0:
        return {"bucket": bucket, "add": None, "remove": [], "rows": None, "conflicts": [], "seconds": 0.0}
    conflicts: list[str] = []
    if spec.key_order == "partition":
        conflicts = [f"{k} (partitions of this micro-batch)" for k in _conflicts_within(incoming, key)]
    incoming = _latest(incoming, key, spec.key_order)
    tfs, root = filesystem(spec.table_uri)
    columns = list(spec.output_schema.names)
    existing = (pa.concat_tables([pq.read_table(f"{root}/{c['path']}", filesystem=tfs, columns=columns)
                                  for c in current]) if current else spec.output_schema.empty_table())
    if spec.key_order == "partition" and existing.num_rows:
        j = existing.select([key, "source_partition"]).join(
            incoming.select([key, "source_partition"]).rename_columns([key, "in_partition"]), key)
        moved = j.filter(pc.not_equal(j["source_partition"], j["in_partition"]))
        conflicts += [f"{r[key]} (partition {r['source_partition']} in the table, {r['in_partition']} now)"
                      for r in moved.slice(0, MAX_CONFLICTS).to_pylist()]
    if conflicts:
        return {"bucket": bucket, "add": None, "remove": [], "rows": None, "conflicts": conflicts[:MAX_CONFLICTS],
                "seconds": time.perf_counter() - t0}
    if spec.key_order == "timestamp" and existing.num_rows:
        stale = _newer_existing(existing, incoming, key)
        if len(stale):
            incoming = incoming.filter(pc.invert(pc.is_in(incoming[key], value_set=stale)))
    touched = incoming[key].combine_chunks()
    kept = existing.filter(pc.invert(pc.is_in(existing[key], value_set=touched))) if existing.num_rows else existing
    live = incoming.filter(pc.invert(pc.fill_null(incoming[DELETED], False))).select(columns)
    merged = pa.concat_tables([kept.select(columns), live.cast(spec.output_schema)])
    merged = merged.take(pc.sort_indices(merged, sort_keys=[(key, "ascending")]))
    add = None
    if merged.num_rows:
        add = write_parquet(spec.table_uri, f"{BUCKET_COLUMN}={bucket}/part-{spec.batch_id:08d}-{spec.nonce}.parquet",
                            merged, {BUCKET_COLUMN: str(bucket)}, stats_columns=(key, "source_partition", "source_offset"))
    return {"bucket": bucket, "add": add, "remove": current, "rows": merged.num_rows, "conflicts": [],
            "rewritten_bytes": sum(int(c.get("size") or 0) for c in current),
            "seconds": time.perf_counter() - t0}
