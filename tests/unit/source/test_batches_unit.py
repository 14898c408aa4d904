"""The per-batch plumbing of `jobs.lib.sink.batches.MicroBatches` that needs no Spark: the output table's log is
read for the first batch of a process only, and a batch's size is known from its offset range before it
runs (a small one shuffles into one partition)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from jobs.lib.sink.batches import SMALL_BATCH_RECORDS, MicroBatches


class _Tables:
    table_uri, rejects_uri = "/nowhere/out", "/nowhere/rejects"

    def __init__(self, done: int | None):
        self.done, self.asked = done, []

    def committed(self, batch_id: int) -> bool:
        self.asked.append(batch_id)
        return self.done is not None and batch_id <= self.done


def _batches(tmp_path, done):
    args = SimpleNamespace(checkpoint=str(tmp_path / "ck"), extra={})
    return MicroBatches(args, _Tables(done), name="test")


def test_the_output_table_is_asked_once_per_process_then_this_process_knows(tmp_path):
    b = _batches(tmp_path, done=7)                  # a restart: batch 7 is in the table, Spark replays it
    assert b._committed(7) is True
    assert [b._committed(i) for i in (8, 9, 10)] == [False, False, False]
    assert b.tables.asked == [7]
    fresh = _batches(tmp_path, done=None)           # a new version
    assert [fresh._committed(i) for i in (0, 1, 2)] == [False, False, False] and fresh.tables.asked == [0]


def _offsets(ck, batch_id: int, ends: dict) -> None:
    (ck / "offsets").mkdir(parents=True, exist_ok=True)
    (ck / "offsets" / str(batch_id)).write_text("v1\n{}\n" + json.dumps(ends) + "\n")


def test_a_batch_s_records_are_planned_from_its_offset_range(tmp_path):
    ck = tmp_path / "ck"
    _offsets(ck, 4, {"t": {"0": 100, "1": 50}})
    _offsets(ck, 5, {"t": {"0": 112, "1": 58}})
    b = _batches(tmp_path, done=None)
    assert b._planned_records(5, {"t": {"0": 112, "1": 58}}) == 20
    assert b._planned_records(9, None) is None
    assert SMALL_BATCH_RECORDS >= 1000
