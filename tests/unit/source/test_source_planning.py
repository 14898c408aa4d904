"""Offset arithmetic, cap splitting, range planning and option parsing of the Kafka source (no services)."""

from __future__ import annotations

import json
import pickle

import pytest

from jobs.lib.kafka import (
    KafkaDataSource,
    KafkaRange,
    KafkaStreamReader,
    RangeSpec,
    SourceSettings,
    Watermarks,
    checkpoint_offsets,
    last_committed_batch,
    map_to_offsets,
    offsets_to_map,
    plan_end_offsets,
    plan_ranges,
    split_cap,
)
from orchestrator.core.exceptions import SourceError
from pyspark.sql.streaming.datasource import ReadMaxRows


# --- offsets JSON ------------------------------------------------------------------------------

def test_offsets_round_trip_in_canonical_order():
    m = offsets_to_map({"b": {"10": 5, "2": 7}, "a": {"0": 1}})
    assert m == {("b", 10): 5, ("b", 2): 7, ("a", 0): 1}
    out = map_to_offsets(m)
    assert list(out) == ["a", "b"]
    assert list(out["b"]) == ["2", "10"]  # numeric, not lexical
    assert json.dumps(out) == '{"a": {"0": 1}, "b": {"2": 7, "10": 5}}'


@pytest.mark.parametrize("bad, fragment", [
    ([1, 2], "must be a JSON object"),
    ({"t": 5}, "offsets of topic 't' must be an object"),
    ({"t": {"0": "x"}}, "offset of topic 't' partition '0' must be an integer"),
])
def test_offsets_shape_errors_name_the_problem(bad, fragment):
    with pytest.raises(SourceError, match=fragment):
        offsets_to_map(bad)


# --- cap splitting -----------------------------------------------------------------------------

def test_split_cap_equal_shares_and_unused_share_flows_to_others():
    tp = lambda p: ("t", p)  # noqa: E731
    alloc = split_cap({tp(0): 1000, tp(1): 10, tp(2): 1000}, 300)
    assert alloc == {tp(0): 145, tp(1): 10, tp(2): 145}
    assert sum(alloc.values()) == 300


def test_split_cap_never_exceeds_what_is_available():
    avail = {("t", 0): 3, ("t", 1): 0, ("u", 0): 4}
    assert split_cap(avail, 1000) == avail
    assert split_cap(avail, 0) == {("t", 0): 0, ("t", 1): 0, ("u", 0): 0}


def test_split_cap_remainder_goes_to_partitions_with_most_left():
    avail = {("t", 0): 5, ("t", 1): 50, ("t", 2): 20}
    assert split_cap(avail, 2) == {("t", 0): 0, ("t", 1): 1, ("t", 2): 1}
    assert split_cap(avail, 7) == {("t", 0): 2, ("t", 1): 3, ("t", 2): 2}
    # deterministic
    assert split_cap(avail, 7) == split_cap(dict(reversed(list(avail.items()))), 7)


@pytest.mark.parametrize("cap", [1, 2, 3, 17, 99, 100, 101, 10_000])
def test_split_cap_sum_is_min_of_cap_and_total(cap):
    avail = {("t", p): n for p, n in enumerate([0, 1, 7, 30, 62])}
    alloc = split_cap(avail, cap)
    assert sum(alloc.values()) == min(cap, sum(avail.values()))
    assert all(0 <= alloc[tp] <= avail[tp] for tp in avail)


# --- end offsets -------------------------------------------------------------------------------

def wm(low, high):
    return Watermarks(low, high)


def test_plan_caps_rows_across_partitions():
    start = {("t", 0): 0, ("t", 1): 0}
    plan = plan_end_offsets(start, {("t", 0): wm(0, 1000), ("t", 1): wm(0, 40)}, max_rows=100)
    assert plan.end == {("t", 0): 60, ("t", 1): 40}
    uncapped = plan_end_offsets(start, {("t", 0): wm(0, 1000), ("t", 1): wm(0, 40)}, max_rows=None)
    assert uncapped.end == {("t", 0): 1000, ("t", 1): 40}


def test_plan_respects_available_now_target_and_excludes_later_partitions():
    start = {("t", 0): 10}
    wms = {("t", 0): wm(0, 500), ("t", 1): wm(0, 80)}
    plan = plan_end_offsets(start, wms, max_rows=1000, target={("t", 0): 200})
    # t[1] appeared after the target was fixed: present in the offsets, but no data for now
    assert plan.end == {("t", 0): 200, ("t", 1): 0}
    done = plan_end_offsets({("t", 0): 200, ("t", 1): 0}, wms, max_rows=1000, target={("t", 0): 200})
    assert done.end == {("t", 0): 200, ("t", 1): 0}  # equals start: available-now is finished


def test_plan_new_partitions_start_at_zero_and_vanished_ones_keep_their_offsets():
    start = {("t", 0): 50, ("gone", 0): 7}
    plan = plan_end_offsets(start, {("t", 0): wm(0, 60), ("t", 1): wm(0, 30)}, max_rows=None)
    assert plan.end == {("t", 0): 60, ("t", 1): 30, ("gone", 0): 7}
    assert plan.new_partitions == [("t", 1)]


def test_plan_new_partition_whose_log_start_moved_starts_at_log_start_without_error():
    plan = plan_end_offsets({("t", 0): 5}, {("t", 0): wm(0, 5), ("t", 1): wm(40, 50)}, max_rows=None)
    assert plan.end[("t", 1)] == 50
    assert plan.skipped == {}


def test_plan_never_moves_backwards_when_watermark_is_under_reported():
    # a broker reporting a high watermark below an offset already read (a lagging replica's answer)
    # must not rewind
    plan = plan_end_offsets({("t", 0): 10}, {("t", 0): wm(0, 10)}, max_rows=5, target={("t", 0): 8})
    assert plan.end == {("t", 0): 10}


def test_plan_missing_offsets_fail_by_default_with_a_clear_error():
    start = {("t", 0): 5, ("t", 1): 3}
    wms = {("t", 0): wm(20, 100), ("t", 1): wm(0, 10)}
    with pytest.raises(SourceError) as e:
        plan_end_offsets(start, wms, max_rows=100)
    msg = str(e.value)
    assert "t[0] next offset 5 < log start 20 (15 offsets deleted" in msg
    assert "on.missing.offsets=earliest" in msg
    assert "t[1]" not in msg


def test_plan_missing_offsets_beyond_log_end_fail_by_default():
    with pytest.raises(SourceError, match=r"t\[0\] next offset 50 > log end 10 \(the topic was recreated"):
        plan_end_offsets({("t", 0): 50}, {("t", 0): wm(0, 10)}, max_rows=100)


def test_plan_missing_offsets_earliest_continues_from_log_start_and_reports_skip():
    start = {("t", 0): 5, ("t", 1): 3}
    wms = {("t", 0): wm(20, 100), ("t", 1): wm(0, 10)}
    plan = plan_end_offsets(start, wms, max_rows=30, on_missing="earliest")
    assert plan.skipped == {("t", 0): (5, 20)}
    # t[0] reads from 20: available 80, t[1] available 7; cap 30 -> 23 + 7
    assert plan.end == {("t", 0): 43, ("t", 1): 10}
    rewind = plan_end_offsets({("t", 0): 50}, {("t", 0): wm(0, 10)}, max_rows=100, on_missing="earliest")
    assert rewind.end == {("t", 0): 10} and rewind.skipped == {("t", 0): (50, 0)}


# --- ranges ------------------------------------------------------------------------------------

def test_ranges_one_per_partition_when_small():
    ranges = plan_ranges({("t", 0): 0, ("t", 1): 5}, {("t", 0): 100, ("t", 1): 5, ("t", 2): 7},
                         min_partitions=2, split_min_records=1000)
    assert ranges == [RangeSpec("t", 0, 0, 100), RangeSpec("t", 2, 0, 7, new=True)]


def test_large_single_partition_range_is_split_for_every_core():
    ranges = plan_ranges({("t", 0): 1000}, {("t", 0): 101_000}, min_partitions=2, split_min_records=10_000)
    assert ranges == [RangeSpec("t", 0, 1000, 51_000), RangeSpec("t", 0, 51_000, 101_000)]
    ranges = plan_ranges({("t", 0): 0}, {("t", 0): 100_001}, min_partitions=4, split_min_records=10_000)
    assert [r.end - r.start for r in ranges] == [25_001, 25_001, 25_001, 24_998]
    assert ranges[0].start == 0 and ranges[-1].end == 100_001
    assert all(a.end == b.start for a, b in zip(ranges, ranges[1:]))


def test_split_never_below_split_min_records():
    ranges = plan_ranges({("t", 0): 0}, {("t", 0): 15_000}, min_partitions=8, split_min_records=10_000)
    assert [(r.start, r.end) for r in ranges] == [(0, 7500), (7500, 15_000)]


def test_ranges_are_deterministic_and_empty_when_nothing_to_read():
    s, e = {("t", 0): 3, ("t", 1): 9}, {("t", 0): 90_003, ("t", 1): 9}
    assert plan_ranges(s, e, min_partitions=3) == plan_ranges(dict(s), dict(e), min_partitions=3)
    assert plan_ranges(s, s) == []


def test_rewound_partition_reads_from_zero_as_new():
    # only produced under on.missing.offsets=earliest when the log end fell below the checkpoint
    assert plan_ranges({("t", 0): 50}, {("t", 0): 10}) == [RangeSpec("t", 0, 0, 10, new=True)]


# --- options, reader -----------------------------------------------------------------------------

def test_settings_defaults_and_passthrough():
    s = SourceSettings.from_options({"bootstrap.servers": "h:1", "topics": " a, b ,", "group.id": "g",
                                     "kafka.security.protocol": "SASL_SSL", "Kafka.SASL.Mechanism": "PLAIN"})
    assert s.topics == ("a", "b")
    assert s.max_records_per_batch == 100_000
    assert s.isolation_level == "read_committed" and s.on_missing_offsets == "fail"
    conf = s.consumer_config()
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.mechanism"] == "PLAIN"
    assert conf["enable.auto.commit"] is False and conf["auto.offset.reset"] == "error"
    assert conf["isolation.level"] == "read_committed" and conf["group.id"] == "g"


@pytest.mark.parametrize("opts, fragment", [
    ({"topics": "t"}, "kafka.bootstrap.servers is required"),
    ({"bootstrap.servers": "h:1"}, "subscribe is required"),
    ({"bootstrap.servers": "h:1", "topics": "t", "on.missing.offsets": "latest"}, "on.missing.offsets must be one of fail, earliest"),
    ({"bootstrap.servers": "h:1", "topics": "t", "isolation.level": "dirty"}, "isolation.level must be one of"),
    ({"bootstrap.servers": "h:1", "topics": "t", "max.records.per.batch": "0"}, "maxOffsetsPerTrigger must be at least 1"),
    ({"bootstrap.servers": "h:1", "topics": "t", "max.records.per.batch": "lots"}, "must be an integer"),
    ({"bootstrap.servers": "h:1", "topics": "t", "starting.offsets": "{nope"}, "startingOffsets must be earliest, latest or offset JSON"),
    ({"bootstrap.servers": "h:1", "topics": "t", "starting.offsets": '{"u": {"0": 1}}'}, "names topics not in subscribe"),
])
def test_settings_errors_name_the_option(opts, fragment):
    with pytest.raises(SourceError, match=fragment):
        SourceSettings.from_options(opts)


def test_data_source_contract():
    assert KafkaDataSource.name() == "kappa_kafka"
    names = [f.name for f in KafkaDataSource({}).schema().fields]
    assert names == ["key", "value", "topic", "partition", "offset", "timestamp", "headers"]


def test_reader_pickles_without_clients_and_reports_its_read_limit():
    reader = KafkaStreamReader(SourceSettings.from_options(
        {"bootstrap.servers": "h:1", "topics": "t", "max.records.per.batch": "500"}))
    reader._broker = object()  # stands for a live, unpicklable client
    reader._target = {("t", 0): 9}
    clone = pickle.loads(pickle.dumps(reader))
    assert clone._broker is None and clone._target is None and clone.settings == reader.settings
    assert reader.getDefaultReadLimit() == ReadMaxRows(500)
    parts = reader.partitions({"t": {"0": 0}}, {"t": {"0": 30_000}})
    assert all(isinstance(p, KafkaRange) for p in parts) and len(parts) == 2
    assert pickle.loads(pickle.dumps(parts[0])).end == parts[0].end


# --- checkpoint --------------------------------------------------------------------------------

def _write_batch(cp, batch_id, *sources, committed=True):
    (cp / "offsets").mkdir(parents=True, exist_ok=True)
    (cp / "commits").mkdir(parents=True, exist_ok=True)
    lines = ["v1", json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})]
    lines += [json.dumps(s) if s is not None else "-" for s in sources]
    (cp / "offsets" / str(batch_id)).write_text("\n".join(lines))
    if committed:
        (cp / "commits" / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_checkpoint_offsets_of_last_committed_batch(tmp_path):
    assert checkpoint_offsets(tmp_path) is None
    _write_batch(tmp_path, 0, {"t": {"0": 10, "1": 5}})
    _write_batch(tmp_path, 1, {"t": {"0": 20, "1": 9}})
    _write_batch(tmp_path, 2, {"t": {"0": 30, "1": 9}}, committed=False)
    assert checkpoint_offsets(tmp_path) == {"t": {"0": 20, "1": 9}}
    assert last_committed_batch(tmp_path) == 1
    assert checkpoint_offsets(tmp_path, batch_id=2) == {"t": {"0": 30, "1": 9}}
    assert checkpoint_offsets(tmp_path, batch_id=0) == {"t": {"0": 10, "1": 5}}
    assert checkpoint_offsets(tmp_path, batch_id=7) is None


def test_checkpoint_offsets_merges_sources_and_ignores_others(tmp_path):
    _write_batch(tmp_path, 0, {"a": {"0": 10}}, None, {"logOffset": 3}, {"b": {"0": 4}, "a": {"0": 8}})
    assert checkpoint_offsets(tmp_path) == {"a": {"0": 8}, "b": {"0": 4}}


def test_every_piece_of_a_new_partition_is_new():
    # issue 8 (d): a new partition whose log start is above 0 is planned [0, end) and split; a piece
    # not marked new failed offset-out-of-range on every restart
    ranges = plan_ranges({("t", 0): 10}, {("t", 0): 10, ("t", 1): 90_000}, min_partitions=3,
                         split_min_records=10_000)
    assert [(r.start, r.end) for r in ranges] == [(0, 30_000), (30_000, 60_000), (60_000, 90_000)]
    assert all(r.new for r in ranges)
    rewound = plan_ranges({("t", 0): 50_000}, {("t", 0): 30_000}, min_partitions=2, split_min_records=10)
    assert len(rewound) == 2 and all(r.new for r in rewound)
    old = plan_ranges({("t", 0): 0}, {("t", 0): 30_000}, min_partitions=2, split_min_records=10)
    assert len(old) == 2 and not any(r.new for r in old)
