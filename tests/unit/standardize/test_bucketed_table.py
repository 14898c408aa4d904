"""The bucketed Delta table on real local Delta tables, with the task functions called directly
(no Spark): upserts rewrite only touched buckets, the key order rules, replay checks by end
offsets, and upkeep keeps a long-running version's files bounded."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from jobs.lib.bucketed.table import BucketedTable
from jobs.lib.bucketed.tasks import StageSpec, merge_bucket, staged_path
from orchestrator.core.exceptions import SinkError

SCHEMA = pa.schema([("member_id", pa.string()), ("name", pa.string()), ("source_partition", pa.int32()),
                    ("source_offset", pa.int64()), ("source_timestamp", pa.timestamp("us", tz="UTC"))])
BUCKETS = 4


def bucket(key: str) -> int:
    return zlib.crc32(key.encode("utf-8")) % BUCKETS   # the layout's contract, recomputed here


def upserts(rows: list[tuple]) -> pa.Table:
    """(key, name or None for a delete, partition, offset, timestamp µs)"""
    return pa.table({
        "member_id": [r[0] for r in rows], "name": [r[1] for r in rows],
        "source_partition": pa.array([r[2] for r in rows], pa.int32()),
        "source_offset": pa.array([r[3] for r in rows], pa.int64()),
        "source_timestamp": pa.array([r[4] for r in rows], pa.timestamp("us", tz="UTC")),
        "_deleted": [r[1] is None for r in rows]})


class Harness:
    """Runs one micro-batch the way UpsertBatches does, with the tasks called in this process."""

    def __init__(self, root: Path, key_order: str = "partition", vacuum_hours: float = 1.0):
        self.table = BucketedTable(str(root / "out"), None, "kappa.t.v1", SCHEMA, buckets=BUCKETS,
                                   vacuum_hours=vacuum_hours)
        self.table.ensure()
        self.key_order = key_order

    def batch(self, batch_id: int, rows: list[tuple], end: dict | None = None) -> list[dict]:
        spec = StageSpec(table_uri=self.table.table_uri, rejects_uri=None,
                         staging_uri=f"{self.table.staging_root}/batch-{batch_id}", batch_id=batch_id,
                         buckets=BUCKETS, key_column="member_id", settings=None, transform=None,
                         output_schema=SCHEMA, key_order=self.key_order)
        t = upserts(rows)
        paths: dict[int, list[str]] = {}
        import pyarrow.ipc as ipc
        for i, part in enumerate(sorted({r[2] for r in rows})):
            piece = t.filter(pa.compute.equal(t["source_partition"], part))
            for b in sorted({bucket(k) for k in piece["member_id"].to_pylist()}):
                sub = piece.filter(pa.array([bucket(k) == b for k in piece["member_id"].to_pylist()]))
                path = staged_path(spec.staging_uri, b, "t", part, batch_id * 1000)
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                with ipc.new_file(path, sub.schema) as w:
                    w.write_table(sub)
                paths.setdefault(b, []).append(path)
        current = self.table.current_files(set(paths))
        merged = [merge_bucket(spec, b, paths[b], current[b]) for b in sorted(paths)]
        conflicts = [c for m in merged for c in m["conflicts"]]
        if conflicts:
            raise SinkError(f"conflicts: {conflicts}")
        self.table.commit(batch_id, [m["add"] for m in merged if m["add"]], [r for m in merged for r in m["remove"]],
                          end or {"t": {"0": batch_id + 1}})
        self.table.drop_staging(spec.staging_uri)
        self.table.upkeep()
        return merged

    def rows(self) -> dict[str, str]:
        t = DeltaTable(self.table.table_uri).to_pyarrow_table()
        assert all(bucket(k) == b for k, b in zip(t["member_id"].to_pylist(), t["key_bucket"].to_pylist()))
        return dict(zip(t["member_id"].to_pylist(), t["name"].to_pylist()))


def test_upsert_rewrites_only_the_touched_buckets(tmp_path):
    h = Harness(tmp_path)
    keys = [f"m{i:03d}" for i in range(200)]
    h.batch(0, [(k, f"v0-{k}", 0, i, i) for i, k in enumerate(keys)])
    assert h.table.file_count() == BUCKETS
    touched = [k for k in keys if bucket(k) == bucket(keys[0])][:3]
    merged = h.batch(1, [(touched[0], "changed", 0, 500, 500), (touched[1], None, 0, 501, 501)])
    assert [m["bucket"] for m in merged] == [bucket(keys[0])] and len(merged[0]["remove"]) == 1
    rows = h.rows()
    assert rows[touched[0]] == "changed" and touched[1] not in rows and rows[touched[2]] == f"v0-{touched[2]}"
    assert len(rows) == 199 and h.table.file_count() == BUCKETS


def test_key_in_two_partitions_refused_under_partition_order(tmp_path):
    h = Harness(tmp_path)
    h.batch(0, [("m1", "a", 0, 0, 0)])
    with pytest.raises(SinkError, match=r"m1 \(partition 0 in the table, 1 now\)"):
        h.batch(1, [("m1", "b", 1, 0, 10)])
    with pytest.raises(SinkError, match=r"m2 \(partitions of this micro-batch\)"):
        h.batch(1, [("m2", "x", 0, 1, 1), ("m2", "y", 1, 1, 2)])
    assert h.rows() == {"m1": "a"}


def test_timestamp_order_keeps_the_newer_row_whatever_arrives_later(tmp_path):
    h = Harness(tmp_path, key_order="timestamp")
    h.batch(0, [("m1", "new", 1, 0, 100), ("m1", "old", 0, 9, 50), ("m2", "p0", 0, 1, 10)])
    assert h.rows() == {"m1": "new", "m2": "p0"}
    h.batch(1, [("m1", "stale", 0, 10, 60), ("m2", "later", 1, 1, 20)])   # higher offset, older time
    assert h.rows() == {"m1": "new", "m2": "later"}
    h.batch(2, [("m1", None, 0, 11, 200)])   # a newer tombstone from the other partition deletes
    assert h.rows() == {"m2": "later"}


def test_replay_check_compares_end_offsets(tmp_path):
    h = Harness(tmp_path)
    h.batch(0, [("m1", "a", 0, 0, 0)], end={"t": {"0": 1, "1": 0}})
    assert h.table.check_replay(0, {"t": {"1": 0, "0": 1}}) is True
    assert h.table.check_replay(1, {"t": {"0": 5}}) is False
    with pytest.raises(SinkError, match="already holds micro-batch 0 .* the checkpoint is not the one"):
        h.table.check_replay(0, {"t": {"0": 7, "1": 0}})


def test_a_table_of_another_layout_is_refused(tmp_path):
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "out"), pa.table({"member_id": ["m1"]}))
    with pytest.raises(SinkError, match="is not a bucketed kappa table .* deploy a new version"):
        BucketedTable(str(tmp_path / "out"), None, "a", SCHEMA, buckets=BUCKETS).ensure()


def test_many_micro_batches_keep_files_bounded(tmp_path):
    """Upkeep: 120 live micro-batches leave one data file per bucket referenced, unreferenced
    files vacuumed (retention 0 here), and a Delta log checkpoint."""
    h = Harness(tmp_path, vacuum_hours=0)
    for b in range(120):
        h.batch(b, [(f"m{(b * 7 + j) % 50:02d}", f"v{b}", 0, b * 10 + j, b * 10 + j) for j in range(3)])
    out = Path(h.table.table_uri)
    data_files = [p for p in out.rglob("*.parquet") if "_delta_log" not in p.parts]
    assert h.table.file_count() <= BUCKETS
    # vacuum runs with the checkpoint every CHECKPOINT_EVERY commits: what it has not reached yet is
    # at most the files replaced since the last one
    assert len(data_files) <= BUCKETS + 3 * 30
    assert list((out / "_delta_log").glob("*.checkpoint.parquet"))
    assert json.loads((out / "_delta_log" / "_last_checkpoint").read_text())["version"] >= 100
    assert len(h.rows()) == 50


def test_merge_groups_deal_every_bucket_once_to_at_most_the_tasks_asked():
    from jobs.lib.bucketed.batch import merge_groups

    work = [(b, ["x"] * (b % 3 + 1), []) for b in range(32)]
    groups = merge_groups(work, 4)
    assert len(groups) == 4 and sorted(w[0] for g in groups for w in g) == list(range(32))
    assert merge_groups(work[:3], 4) == [[work[2]], [work[1]], [work[0]]]   # fewer buckets than tasks
    assert merge_groups([], 4) == [[]]
