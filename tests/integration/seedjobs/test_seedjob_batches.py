"""The seed jobs' foreachBatch writer on a real Spark session and delta-spark: the split of a stateful
stream's rows into output, rejects and counts; rejects committed before the output; upserts with
deletes; appends; and a replayed batch that runs its plan but writes nothing."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from jobs.lib.runtime.seedjob import SeedBatches
from jobs.pageviews_hourly import OUTPUT_SCHEMA as HOURLY_SCHEMA
from jobs.profile_settings_join import OUTPUT_SCHEMA as JOIN_SCHEMA
from orchestrator.core.tables import read_table

pytestmark = pytest.mark.integration

START = datetime(2024, 5, 1, 8, 0, tzinfo=timezone.utc)
TAIL = {"key": pa.binary(), "value": pa.binary(), "topic": pa.string(), "partition": pa.int32(),
        "offset": pa.int64(), "error": pa.string(), "input_rows": pa.int64()}


def args(tmp_path) -> argparse.Namespace:
    return argparse.Namespace(output=str(tmp_path / "out"), rejects=str(tmp_path / "out__rejects"), pipeline="p",
                              version=1, checkpoint=str(tmp_path / "cp"), bootstrap_servers=None, extra={})


def hourly_rows(views: int) -> pa.Table:
    """One window count, one reject, two count rows (10 and 5 records read), as the job's stream has them."""
    ts = pa.array([START, None, None, None], pa.timestamp("us", tz="UTC"))
    cols = {"member_id": pa.array(["m1", None, None, None]), "window_start": ts, "window_end": ts,
            "views": pa.array([views, None, None, None], pa.int64()),
            "key": pa.array([None, b"k", None, None], pa.binary()),
            "value": pa.array([None, b"v", None, None], pa.binary()),
            "topic": pa.array([None, "pv", None, None]), "partition": pa.array([None, 1, None, None], pa.int32()),
            "offset": pa.array([None, 7, None, None], pa.int64()),
            "error": pa.array([None, "bad", None, None]),
            "input_rows": pa.array([None, None, 10, 5], pa.int64())}
    return pa.table(cols)


def versions(uri: str) -> list[int]:
    from deltalake import DeltaTable

    return sorted(h["version"] for h in DeltaTable(uri).history())


def test_upsert_split_order_and_replay(spark, tmp_path):
    reported = []
    writer = SeedBatches(args(tmp_path), HOURLY_SCHEMA, mode="upsert", key_columns=["member_id", "window_start"],
                         name="pageviews_hourly", on_batch=lambda *a, timing: reported.append(a))
    writer(spark.createDataFrame(hourly_rows(3)), 0)
    out, rejects = read_table(str(tmp_path / "out")), read_table(str(tmp_path / "out__rejects"))
    assert out.to_pylist() == [{"member_id": "m1", "window_start": START, "window_end": START, "views": 3}]
    assert rejects.select(["key", "value", "topic", "partition", "offset", "error", "batch_id"]).to_pylist() == [
        {"key": b"k", "value": b"v", "topic": "pv", "partition": 1, "offset": 7, "error": "bad", "batch_id": 0}]
    assert reported == [(0, 15, 1, 1, 1)]
    # the next batch updates the window (a MERGE by both key columns), its reject appended
    writer(spark.createDataFrame(hourly_rows(5)), 1)
    assert read_table(str(tmp_path / "out")).column("views").to_pylist() == [5]
    assert read_table(str(tmp_path / "out__rejects")).num_rows == 2
    assert reported[-1] == (1, 15, 1, 1, 2)
    # a replay of batch 1 (a crash before Spark's checkpoint commit) writes nothing, and runs the plan
    before = versions(str(tmp_path / "out")), versions(str(tmp_path / "out__rejects"))
    marker = tmp_path / "plan-ran"

    def mark(batches, path=str(marker)):   # runs where the plan runs: the replay must run it
        for b in batches:
            open(path, "a").close()
            yield b

    replayed = spark.createDataFrame(hourly_rows(99))
    writer(replayed.mapInArrow(mark, replayed.schema), 1)
    assert writer.skipped == [1] and len(reported) == 2 and marker.exists()
    assert (versions(str(tmp_path / "out")), versions(str(tmp_path / "out__rejects"))) == before
    assert read_table(str(tmp_path / "out")).column("views").to_pylist() == [5]


def test_upsert_deletes_and_append_keeps_every_row(spark, tmp_path):
    def join_rows(deleted: list[bool]) -> pa.Table:
        n = len(deleted)
        cols = {f.name: pa.nulls(n, f.type) for f in JOIN_SCHEMA}
        cols["member_id"] = pa.array([f"m{i}" for i in range(n)])
        cols["_deleted"] = pa.array(deleted)
        cols.update({k: pa.nulls(n, t) for k, t in TAIL.items()})
        return pa.table(cols)

    up = SeedBatches(args(tmp_path), JOIN_SCHEMA, mode="upsert", key_columns=["member_id"], name="j")
    up(spark.createDataFrame(join_rows([False, False, False])), 0)
    up(spark.createDataFrame(join_rows([True, False])), 1)     # m0 deleted, m1 updated
    assert sorted(read_table(str(tmp_path / "out")).column("member_id").to_pylist()) == ["m1", "m2"]
    assert read_table(str(tmp_path / "out")).schema.names == JOIN_SCHEMA.names
    other = tmp_path / "append"
    other.mkdir()
    app = SeedBatches(args(other), JOIN_SCHEMA, mode="append", name="j")
    app(spark.createDataFrame(join_rows([False, True])), 0)
    app(spark.createDataFrame(join_rows([False, True])), 1)
    assert read_table(str(other / "out")).num_rows == 4


def test_upkeep_compacts_every_n_batches_and_keeps_files_a_reader_may_still_open(spark, tmp_path):
    from deltalake import DeltaTable

    a = args(tmp_path)
    a.extra = {"upkeep": {"optimize_every": 2, "vacuum_retention_hours": 1}}
    rows = pa.table({**{f.name: pa.array([f"x{i}" for i in range(3)]) if f.name == "member_id"
                        else pa.nulls(3, f.type) for f in JOIN_SCHEMA},
                     **{k: pa.nulls(3, t) for k, t in TAIL.items()}})
    app = SeedBatches(a, JOIN_SCHEMA, mode="append", name="j")
    app(spark.createDataFrame(rows), 0)
    files_before = set(DeltaTable(str(tmp_path / "out")).file_uris())
    assert app.upkeep.runs == []                       # one batch: not yet
    app(spark.createDataFrame(rows), 1)
    out = DeltaTable(str(tmp_path / "out"))
    assert "OPTIMIZE" in [h["operation"] for h in out.history()]
    (run,) = [r for r in app.upkeep.runs if r["table"] == str(tmp_path / "out")]
    assert run["files_removed"] >= 2 and run["files_added"] == 1 and len(out.file_uris()) == 1
    assert read_table(str(tmp_path / "out")).num_rows == 6
    # VACUUM ran with a 1 h retention: the files OPTIMIZE replaced a moment ago stay for readers of
    # the snapshot before it
    from pathlib import Path
    from urllib.parse import urlparse
    assert all(Path(urlparse(u).path if u.startswith("file:") else u).exists() for u in files_before)
    assert read_table(DeltaTable(str(tmp_path / "out"), version=1)).num_rows == 6   # the snapshot before OPTIMIZE
