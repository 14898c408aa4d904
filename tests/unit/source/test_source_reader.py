"""The executor-side range reader against a simulated partition log (no services).

The simulation covers what a real broker produces only by chance: a log start that moved past the
range while it was read, a log truncated below the planned end, a client that does not advance its
position past control records. The real broker is exercised in
tests/integration/source.
"""

from __future__ import annotations

import time

import confluent_kafka
import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, Message, TopicPartition

from jobs.lib.kafka import reading
from jobs.lib.kafka import KafkaRange, SourceSettings, arrow_schema, messages_to_batch, read_range
from orchestrator.core.exceptions import SourceError


def FakeMsg(offset, key=None, value=None, headers=None, ts=1_700_000_000_123, err=None):
    """A real confluent_kafka.Message, as the client would hand it out."""
    return Message(topic="t", partition=0, offset=offset, key=key, value=value, headers=headers,
                   timestamp=(1, ts), error=err)


def FakeError(code, text=""):
    return KafkaError(code, text or f"error {code}")


class FakeLog:
    """One partition: data records by offset, control-record offsets, log start and end."""

    def __init__(self, data: dict[int, tuple], controls=(), low=0, high=None, position_skips_controls=True):
        self.data = data
        self.controls = set(controls)
        self.low = low
        self.high = high if high is not None else max([*data, *self.controls, -1]) + 1
        self.position_skips_controls = position_skips_controls
        self.consumers: list[FakeConsumer] = []


class FakeConsumer:
    """Enough of confluent_kafka.Consumer for one assigned partition, librdkafka semantics."""

    def __init__(self, log: FakeLog, conf: dict):
        self.log, self.conf = log, conf
        self.fetch = None
        self.app_pos = -1001
        self.eof_at = None
        self.reset_error_sent = False
        self.closed = False
        log.consumers.append(self)

    def assign(self, tps):
        self.fetch = tps[0].offset
        self.reset_error_sent = False
        self.eof_at = None

    def consume(self, n, timeout):
        log = self.log
        if self.fetch < log.low or self.fetch > log.high:
            if self.reset_error_sent:
                time.sleep(0.01)
                return []
            self.reset_error_sent = True
            return [FakeMsg(self.fetch, err=FakeError(KafkaError._AUTO_OFFSET_RESET, "Offset out of range"))]
        out = []
        while len(out) < n and self.fetch < log.high:
            o = self.fetch
            self.fetch += 1
            if o in log.data:
                k, v, h = (log.data[o] + (None,))[:3]
                out.append(FakeMsg(o, k, v, h))
                self.app_pos = o + 1
            elif o in log.controls and log.position_skips_controls:
                self.app_pos = o + 1
        if self.fetch >= log.high and self.eof_at != log.high and len(out) < n:
            self.eof_at = log.high
            out.append(FakeMsg(log.high, err=FakeError(KafkaError._PARTITION_EOF, "EOF")))
        if not out:
            time.sleep(0.01)
        return out

    def position(self, tps):
        return [TopicPartition(tps[0].topic, tps[0].partition, self.app_pos)]

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        return self.log.low, self.log.high

    def close(self):
        self.closed = True


@pytest.fixture
def fake_log(monkeypatch):
    holder: dict = {}

    def install(log: FakeLog) -> FakeLog:
        holder["log"] = log
        return log

    monkeypatch.setattr(confluent_kafka, "Consumer", lambda conf: FakeConsumer(holder["log"], conf))
    monkeypatch.setattr(reading._RangeReader, "STALL_CHECK_SECONDS", 0.05)
    return install


def settings(**opts):
    return SourceSettings.from_options({"bootstrap.servers": "fake:1", "topics": "t", **opts})


def read(r: KafkaRange, **opts) -> pa.Table:
    batches = list(read_range(settings(**opts), r))
    return pa.Table.from_batches(batches, schema=arrow_schema())


def offsets_of(table: pa.Table) -> list[int]:
    return table.column("offset").to_pylist()


def test_reads_exactly_the_range_and_closes_the_consumer(fake_log):
    log = fake_log(FakeLog({o: (b"k%d" % o, b"v%d" % o) for o in range(100)}))
    t = read(KafkaRange("t", 0, 10, 20))
    assert offsets_of(t) == list(range(10, 20))
    assert t.column("key").to_pylist()[0] == b"k10"
    assert all(c.closed for c in log.consumers)


def test_offset_gaps_finish_by_position_not_count(fake_log):
    data = {o: (b"k", b"v") for o in (0, 1, 5, 9, 14)}  # compacted: gaps everywhere
    fake_log(FakeLog(data, high=20))
    assert offsets_of(read(KafkaRange("t", 0, 0, 10))) == [0, 1, 5, 9]
    assert offsets_of(read(KafkaRange("t", 0, 2, 5))) == []  # a range with no record at all
    assert offsets_of(read(KafkaRange("t", 0, 10, 20))) == [14]


@pytest.mark.parametrize("skips", [True, False], ids=["position-past-markers", "position-stops-at-marker"])
def test_control_records_at_range_end_and_marker_only_ranges(fake_log, skips):
    # txn 1: 0..2 data, 3 commit marker; txn 2: 4..5 data, 6 marker
    fake_log(FakeLog({0: (b"a", b"1"), 1: (b"b", b"2"), 2: (b"c", b"3"), 4: (b"d", b"4"), 5: (b"e", b"5")},
                     controls=(3, 6), position_skips_controls=skips))
    assert offsets_of(read(KafkaRange("t", 0, 0, 4))) == [0, 1, 2]
    assert offsets_of(read(KafkaRange("t", 0, 3, 4))) == []
    assert offsets_of(read(KafkaRange("t", 0, 4, 7))) == [4, 5]
    assert offsets_of(read(KafkaRange("t", 0, 6, 7))) == []


def test_never_emits_at_or_beyond_range_end_even_if_the_fetch_returns_more(fake_log):
    fake_log(FakeLog({o: (b"k", b"v") for o in range(50)}))
    assert offsets_of(read(KafkaRange("t", 0, 0, 5))) == [0, 1, 2, 3, 4]


def test_arrow_batches_are_bounded(fake_log):
    fake_log(FakeLog({o: (b"k", b"v") for o in range(25_000)}))
    batches = list(read_range(settings(**{"arrow.batch.rows": "10000"}), KafkaRange("t", 0, 0, 25_000)))
    assert sum(b.num_rows for b in batches) == 25_000
    assert max(b.num_rows for b in batches) <= 10_000 + reading._RangeReader.CHUNK


def test_log_start_moved_past_the_range_start_fails_by_default(fake_log):
    fake_log(FakeLog({o: (b"k", b"v") for o in range(40, 60)}, low=40))
    with pytest.raises(SourceError, match=r"no longer has offset 10 of topic t partition 0 range \[10, 50\)"
                                          r" \(log is now \[40, 60\)\).*on.missing.offsets=earliest"):
        read(KafkaRange("t", 0, 10, 50))


def test_log_start_moved_with_earliest_skips_and_logs(fake_log, caplog):
    fake_log(FakeLog({o: (b"k", b"v") for o in range(40, 60)}, low=40))
    assert offsets_of(read(KafkaRange("t", 0, 10, 50), **{"on.missing.offsets": "earliest"})) == list(range(40, 50))
    assert "skips offsets 10..39 (30 offsets" in caplog.text
    assert offsets_of(read(KafkaRange("t", 0, 10, 30), **{"on.missing.offsets": "earliest"})) == []


def test_new_partition_starts_at_its_log_start_under_fail_policy(fake_log):
    fake_log(FakeLog({o: (b"k", b"v") for o in range(5, 9)}, low=5))
    assert offsets_of(read(KafkaRange("t", 1, 0, 9, new=True))) == [5, 6, 7, 8]


def test_log_ending_before_the_planned_end_raises_instead_of_hanging(fake_log):
    fake_log(FakeLog({o: (b"k", b"v") for o in range(10)}, high=10))
    with pytest.raises(SourceError, match=r"no longer has offsets 10..19 of topic t partition 0 range \[0, 20\)"):
        read(KafkaRange("t", 0, 0, 20))
    got = read(KafkaRange("t", 0, 0, 20), **{"on.missing.offsets": "earliest"})
    assert offsets_of(got) == list(range(10))


def test_no_progress_with_data_on_the_broker_times_out_with_a_clear_error(fake_log, monkeypatch):
    log = fake_log(FakeLog({o: (b"k", b"v") for o in range(10)}))
    monkeypatch.setattr(FakeConsumer, "consume", lambda self, n, timeout: time.sleep(0.01) or [])
    with pytest.raises(SourceError, match=r"no progress reading topic t partition 0 range \[0, 10\).*"
                                          r"broker reports log \[0, 10\)"):
        read(KafkaRange("t", 0, 0, 10), **{"read.timeout.seconds": "0.3"})
    assert all(c.closed for c in log.consumers)


def test_messages_to_batch_schema_tombstones_headers_timestamps():
    msgs = [FakeMsg(7, b"k1", b"v1", [("h", b"x"), ("n", None)]), FakeMsg(8, b"k2", None),
            FakeMsg(9, None, b"v3", ts=-1)]
    b = messages_to_batch(msgs, "topic-a", 3)
    assert b.schema.equals(arrow_schema())
    assert b.column("value").to_pylist() == [b"v1", None, b"v3"]
    assert b.column("key").to_pylist() == [b"k1", b"k2", None]
    assert b.column("topic").to_pylist() == ["topic-a"] * 3
    assert b.column("partition").to_pylist() == [3, 3, 3]
    assert b.column("headers").to_pylist() == [[{"key": "h", "value": b"x"}, {"key": "n", "value": None}], None, None]
    ts = b.column("timestamp").to_pylist()
    assert ts[0].isoformat() == "2023-11-14T22:13:20.123000+00:00" and ts[2] is None
    assert messages_to_batch(msgs[1:], "t", 0).column("headers").to_pylist() == [None, None]


def test_new_partition_with_a_moved_log_start_reads_from_it_in_every_planned_piece(fake_log):
    """issue 8 (d): the new partition's end comes from its log start (planned by plan_end_offsets),
    its ranges from plan_ranges; every piece must read, none fail offset-out-of-range, also when
    the batch is replayed from the logged offsets after the log start moved further."""
    from jobs.lib.kafka import Watermarks, plan_end_offsets, plan_ranges

    log = fake_log(FakeLog({o: (b"k", b"v%d" % o) for o in range(700, 1000)}, low=700, high=1000))
    start = {("t", 0): 5}
    plan = plan_end_offsets(start, {("t", 0): Watermarks(0, 5), ("t", 1): Watermarks(700, 1000)},
                            max_rows=None)
    assert plan.end[("t", 1)] == 1000
    ranges = plan_ranges(start, plan.end, min_partitions=4, split_min_records=10)
    assert [r.partition for r in ranges] == [1, 1, 1, 1] and ranges[0].start == 0
    got = [offsets_of(read(KafkaRange(r.topic, r.partition, r.start, r.end, r.new))) for r in ranges]
    assert [o for part in got for o in part] == list(range(700, 1000))
    log.low = 800  # the restart replays the logged batch; retention moved the log start meanwhile
    got = [offsets_of(read(KafkaRange(r.topic, r.partition, r.start, r.end, r.new))) for r in ranges]
    assert [o for part in got for o in part] == list(range(800, 1000))
