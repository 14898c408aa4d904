"""Read progress of the standardize job's backfill, without services: the bounds of a batch's
range rows, which batch reports (`UpsertBatches._report_to`), the stage task handing the report
directory to the Kafka reader, and the report dropped once Spark committed the batch."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pyarrow as pa
import pytest

from jobs.lib.bucketed.batch import UpsertBatches, batch_bounds, clear_when_committed
from jobs.lib.bucketed.tasks import StageSpec, stage_piece
from jobs.lib.kafka.progress import MANIFEST, RangeReport, backfill_reading, progress_dir, read_progress, source_dir
from tests.waiting import wait_until

T = "profiles"


def test_batch_bounds_are_the_lowest_start_and_highest_end_of_each_partition():
    rows = [(T, 0, 250, 500, False), (T, 0, 0, 250, False), (T, 1, 0, 90, False), (T, 2, 7, 7, False)]
    assert batch_bounds(rows) == ({(T, 0): 0, (T, 1): 0, (T, 2): 7}, {(T, 0): 500, (T, 1): 90, (T, 2): 7})
    assert batch_bounds([]) == ({}, {})


def writer(tmp_path, *, progress=True, backfill="one-batch") -> UpsertBatches:
    settings = SimpleNamespace(topics=(T,), backfill=backfill)
    return UpsertBatches(None, settings, None, "member_id", progress=progress_dir(tmp_path) if progress else None)


ROWS = [(T, 0, 0, 250, False), (T, 0, 250, 400, False), (T, 1, 0, 100, False), (T, 2, 5, 5, False)]


def test_only_the_backfill_batch_writes_its_manifest_and_reports(tmp_path):
    pieces = [r for r in ROWS if r[3] > r[2]]
    where = writer(tmp_path)._report_to(0, ROWS, pieces)
    assert where == source_dir(progress_dir(tmp_path), (T,))
    manifest = json.loads(open(os.path.join(where, MANIFEST), encoding="utf-8").read())
    assert manifest == {"start": {T: {"0": 0, "1": 0, "2": 5}}, "end": {T: {"0": 400, "1": 100, "2": 5}}, "scans": 1}
    RangeReport(where, T, 0, 0, 250).update(250, final=True)
    assert backfill_reading(tmp_path) == {"batch_id": 0, "records_read": 250, "records_total": 500}
    # a replanned backfill (a restart before the commit) starts its reports afresh
    assert writer(tmp_path)._report_to(0, ROWS, pieces) == where
    assert read_progress(tmp_path)[0].reads == {}
    assert writer(tmp_path)._report_to(1, ROWS, pieces) is None             # a live batch
    assert writer(tmp_path)._report_to(0, ROWS[3:], []) is None             # nothing to read
    assert writer(tmp_path, progress=False)._report_to(0, ROWS, pieces) is None
    assert writer(tmp_path / "c", backfill="capped")._report_to(0, ROWS, pieces) is None
    assert not (tmp_path / "c").exists()


def test_the_report_is_dropped_once_spark_commits_the_batch(tmp_path):
    where = writer(tmp_path)._report_to(0, ROWS, ROWS[:3])
    thread = clear_when_committed(where, str(tmp_path), 0, poll=0.02)
    assert os.path.exists(where) and thread.is_alive()   # Spark has not committed batch 0 yet
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "0").write_text("v1\n{}\n")
    wait_until(lambda: os.path.exists(where), "the read progress dropped after the commit", 10,
               poll=0.02, done=lambda there: not there)
    thread.join(5)
    assert not thread.is_alive()


def test_stage_piece_hands_the_report_directory_to_the_reader(monkeypatch, tmp_path):
    from jobs.lib.kafka import reading

    seen = []

    def fake_read_range(settings, r):
        seen.append((r.topic, r.partition, r.start, r.end, r.progress))
        return iter(())

    monkeypatch.setattr(reading, "read_range", fake_read_range)
    empty = pa.table({"member_id": pa.array([], pa.string())})
    result = SimpleNamespace(upserts=empty, rejects=pa.table({"x": pa.array([], pa.int64())}), rows_in=0,
                             tombstones=0)
    spec = StageSpec(table_uri=str(tmp_path / "t"), rejects_uri=None, staging_uri=str(tmp_path / "s"), batch_id=0,
                     buckets=4, key_column="member_id", settings=None, transform=lambda records, b: result,
                     output_schema=empty.schema, progress="/ck/kappa-read-progress/profiles")
    out = stage_piece(spec, (0, (T, 1, 10, 20, False)))
    assert out["rows_in"] == 0 and seen == [(T, 1, 10, 20, "/ck/kappa-read-progress/profiles")]
    stage_piece(StageSpec(**{**spec.__dict__, "progress": None}), (1, (T, 1, 20, 30, False)))
    assert seen[-1][-1] is None


@pytest.mark.parametrize("batch_id", [0, 3])
def test_a_replayed_backfill_drops_a_dead_runs_reports(tmp_path, batch_id):
    w = writer(tmp_path)
    where = w._report_to(0, ROWS, ROWS[:3])
    w.table = SimpleNamespace(ensure=lambda: None, check_replay=lambda b, end: True, table_uri="t", app_id="a")
    w.rejects_total = 0
    w._rows = lambda df, b: ROWS
    w(None, batch_id)
    assert os.path.exists(where) == (batch_id != 0) and w.skipped == [batch_id]
