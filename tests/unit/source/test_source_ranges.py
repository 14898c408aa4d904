"""The ranges source's rows, and the same rows planned on the driver from a checkpoint's offset log."""

from __future__ import annotations

import json

from jobs.lib.kafka.options import SourceSettings
from jobs.lib.kafka.ranges import KafkaRangesReader, logged_rows, split_task_ranges

SETTINGS = SourceSettings.from_options({"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"})


def write_offset_log(root, batch_id: int, offsets: dict) -> None:
    """An offset-log file as Spark writes it: version, metadata, then one line per source."""
    d = root / "offsets"
    d.mkdir(parents=True, exist_ok=True)
    (d / str(batch_id)).write_text("v1\n" + json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1}) + "\n"
                                   + json.dumps(offsets) + "\n", encoding="utf-8")


def test_split_keeps_every_piece_of_a_new_partition_new():
    assert split_task_ranges([("t", 0, 0, 10, True), ("t", 1, 5, 9, False)], 4) == [
        ("t", 0, 0, 4, True), ("t", 0, 4, 8, True), ("t", 0, 8, 10, True), ("t", 1, 5, 9, False)]


def test_logged_rows_equal_the_sources_rows(tmp_path):
    reader = KafkaRangesReader(SETTINGS, task_records=3000)
    ends = [{"t": {"0": 10_000, "1": 4_000, "2": 0}}, {"t": {"0": 10_500, "1": 4_000, "2": 7, "3": 20}}]
    for b, end in enumerate(ends):
        write_offset_log(tmp_path, b, end)
    source_rows = [reader.partitions({}, ends[0])[0].rows, reader.partitions(ends[0], ends[1])[0].rows]
    assert [logged_rows(str(tmp_path), b, SETTINGS, 3000) for b in (0, 1)] == source_rows
    assert ("t", 2, 0, 0, False) in source_rows[0] and ("t", 1, 4000, 4000, False) in source_rows[1]
    assert ("t", 3, 0, 20, True) in source_rows[1]   # a new partition, read from its log start
    assert max(r[3] - r[2] for r in source_rows[0]) <= 3000


def test_logged_rows_are_unknown_where_the_checkpoint_cannot_tell(tmp_path):
    assert logged_rows(str(tmp_path), 0, SETTINGS, 3000) is None            # no offset log yet
    write_offset_log(tmp_path, 1, {"t": {"0": 5}})
    assert logged_rows(str(tmp_path), 1, SETTINGS, 3000) is None            # batch 0 missing
    latest = SourceSettings.from_options({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "startingOffsets": "latest"})
    write_offset_log(tmp_path, 0, {"t": {"0": 5}})
    assert logged_rows(str(tmp_path), 0, latest, 3000) is None             # start unknown: not from zero
    assert logged_rows(str(tmp_path), 0, SETTINGS, 3000) == [("t", 0, 0, 5, True)]
