"""Executor side of the Kafka source: read one offset range into pyarrow RecordBatches.

Everything here runs on an executor, once per `KafkaRange`, with a consumer of its own, and is
stateless between ranges. Correctness rules that hold for compacted and transactional topics:

* A range ``[start, end)`` is finished when the consumer's position reaches ``end`` (or a record at
  or beyond ``end`` arrives, or end-of-partition is reported at or beyond ``end``), never by counting
  records: compaction leaves offset gaps and transaction markers take offsets of their own.
* Records at or beyond ``end`` are never emitted (a fetch may return more than was asked).
* A range never blocks forever: without progress the reader re-reads the watermarks and either
  finishes, or raises ``SourceError`` after ``read.timeout.seconds``. While the broker is
  unreachable (`jobs.lib.kafka.outage`) it waits with backoff for ``brokerOutageSeconds`` instead,
  and that wait does not count as a stall: a range survives a broker restart or pause.
* Offsets the broker no longer has: ``SourceError`` by default; with ``failOnDataLoss=false``
  (old name ``on.missing.offsets=earliest``) the range continues from the earliest available offset and logs how many offsets it skipped.

A range of a one-batch backfill also reports, about once a second, the offset it has read up to
(`jobs.lib.kafka.progress`), so the version's lag moves before the batch commits.

RecordBatches are built column by column from ``consume()`` chunks, with the garbage collector
paused: building Python objects per record is where a Python Kafka reader spends its time.
"""

from __future__ import annotations

import bisect
import gc
import logging
import time
from typing import Iterator

from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from jobs.lib.kafka.options import SourceSettings
from jobs.lib.kafka.outage import Outage, is_unavailable
from jobs.lib.kafka.planning import Watermarks
from jobs.lib.kafka.progress import RangeReport
from orchestrator.core.exceptions import SourceError

__all__ = ["SCHEMA", "KafkaRange", "arrow_schema", "messages_to_batch", "read_range"]

log = logging.getLogger("kappa.source")

#: The rows the source produces (`arrow_schema` is its Arrow form, which Spark compares exactly).
SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("headers", ArrayType(StructType([
        StructField("key", StringType()),
        StructField("value", BinaryType()),
    ]))),
])


class KafkaRange(InputPartition):
    """One Spark task: offsets ``[start, end)`` of one topic partition. Picklable, immutable.

    ``progress``: the directory where the task reports how far it has read (a backfill's ranges
    only, `jobs.lib.kafka.progress`); None: no report."""

    def __init__(self, topic: str, partition: int, start: int, end: int, new: bool = False,
                 progress: str | None = None):
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.new = new
        self.progress = progress

    def __repr__(self) -> str:
        return f"KafkaRange({self.topic}[{self.partition}] {self.start}..{self.end}{' new' if self.new else ''})"


_ARROW_SCHEMA = None


def arrow_schema():
    """The Arrow schema Spark expects for `SCHEMA` (Spark compares it exactly)."""
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        from pyspark.sql.pandas.types import to_arrow_schema

        _ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
    return _ARROW_SCHEMA


def messages_to_batch(msgs: list, topic: str, partition: int):
    """confluent-kafka Messages (data records only) -> one pyarrow RecordBatch of `SCHEMA`."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from confluent_kafka import Message

    schema = arrow_schema()
    n = len(msgs)
    # map() over the C methods keeps the per-record Python work to a minimum (this is the hot loop)
    keys = pa.array(list(map(Message.key, msgs)), pa.binary())
    values = pa.array(list(map(Message.value, msgs)), pa.binary())
    offsets = pa.array(list(map(Message.offset, msgs)), pa.int64())
    ts_ms = pa.array([t[1] for t in map(Message.timestamp, msgs)], pa.int64())
    lowest = pc.min(ts_ms).as_py()
    if lowest is not None and lowest < 0:  # TIMESTAMP_NOT_AVAILABLE
        ts_ms = pc.if_else(pc.less(ts_ms, 0), pa.scalar(None, pa.int64()), ts_ms)
    timestamps = pc.multiply(ts_ms, 1000).cast(schema.field("timestamp").type)
    header_type = schema.field("headers").type
    hdrs = list(map(Message.headers, msgs))
    if any(hdrs):
        headers = pa.array([[{"key": k, "value": v} for k, v in h] if h else None for h in hdrs], header_type)
    else:  # null, like Spark's own Kafka source: also cheaper for the JVM than empty arrays
        headers = pa.nulls(n, header_type)
    return pa.RecordBatch.from_arrays(
        [keys, values, pa.repeat(pa.scalar(topic, pa.string()), n),
         pa.repeat(pa.scalar(partition, pa.int32()), n), offsets, timestamps, headers],
        schema=schema)


class _RangeReader:
    """Reads one KafkaRange; finishes by position, never by counting records."""

    STALL_CHECK_SECONDS = 5.0
    CHUNK = 10_000

    def __init__(self, settings: SourceSettings, r: KafkaRange):
        self.s = settings
        self.r = r
        self.pos = r.start
        self.waited_for_broker = False  # set when a watermark read had to wait out an outage

    def _where(self) -> str:
        r = self.r
        return f"topic {r.topic} partition {r.partition} range [{r.start}, {r.end})"

    def run(self) -> Iterator:
        from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

        r, s = self.r, self.s
        if r.end <= r.start:
            return
        consumer = Consumer(s.consumer_config())
        tp = TopicPartition(r.topic, r.partition)
        report = (RangeReport(r.progress, r.topic, r.partition, r.start, r.end)
                  if getattr(r, "progress", None) else None)
        gc_was_enabled = gc.isenabled()
        gc.disable()  # building millions of small objects; the collector would dominate
        try:
            consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
            pending: list = []
            pending_n = 0
            last_progress = time.monotonic()
            last_check = last_progress
            done = False
            while not done:
                # Asking for no more than the range can hold makes consume() return as soon as the
                # range is covered instead of waiting out its timeout.
                msgs = consumer.consume(max(1, min(self.CHUNK, r.end - self.pos)), 0.5)
                data = msgs
                if any(map(Message.error, msgs)):
                    errors = [m for m in msgs if m.error() is not None]
                    data = [m for m in msgs if m.error() is None]
                    for m in errors:
                        err = m.error()
                        code = err.code()
                        if code == KafkaError._PARTITION_EOF:
                            if m.offset() >= r.end:
                                done = True
                        elif code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                            done = self._out_of_range(consumer, tp, str(err))
                            data = []  # anything fetched with the error belongs to the old position
                            break
                        elif err.fatal() or code in (KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                                     KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                                                     KafkaError._SSL, KafkaError.SASL_AUTHENTICATION_FAILED):
                            raise SourceError(f"Kafka error reading {self._where()}: {err}; check the "
                                              f"kafka.* security options")
                        else:
                            # unknown partition (just created), leader moves, transport errors:
                            # librdkafka retries; the stall check bounds how long that may take
                            log.warning("transient Kafka error reading %s: %s", self._where(), err)
                if data:
                    last_off = data[-1].offset()
                    if last_off >= r.end:
                        offs = [m.offset() for m in data]
                        data = data[:bisect.bisect_left(offs, r.end)]
                        done = True
                    self.pos = max(self.pos, last_off + 1)
                    last_progress = time.monotonic()
                    if data:
                        pending.append(data)
                        pending_n += len(data)
                if not done:
                    p = consumer.position([tp])[0].offset
                    if p is not None and p >= 0:
                        if p > self.pos:
                            self.pos = p
                            last_progress = time.monotonic()
                        if p >= r.end:
                            done = True
                if report is not None:
                    report.update(r.end if done else self.pos)
                if pending_n >= s.arrow_batch_rows:
                    yield self._flush(pending)
                    pending, pending_n = [], 0
                if not done:
                    now = time.monotonic()
                    if now - last_progress >= self.STALL_CHECK_SECONDS and now - last_check >= self.STALL_CHECK_SECONDS:
                        last_check = now
                        done = self._stalled(consumer, tp, now - last_progress)
                if self.waited_for_broker:  # time without a broker is not a stall: the idle clock restarts
                    self.waited_for_broker = False
                    last_progress = last_check = time.monotonic()
            if pending_n:
                yield self._flush(pending)
            if report is not None:
                report.update(r.end, final=True)
        finally:
            if gc_was_enabled:
                gc.enable()
            try:
                consumer.close()
            except Exception:
                pass

    def _flush(self, pending: list):
        flat = pending[0] if len(pending) == 1 else [m for chunk in pending for m in chunk]
        return messages_to_batch(flat, self.r.topic, self.r.partition)

    def _watermarks(self, consumer, tp) -> Watermarks:
        """The partition's log start and end; waits out an unreachable broker (see the module)."""
        outage: Outage | None = None
        while True:
            try:
                low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
            except Exception as e:
                if not is_unavailable(e):
                    raise SourceError(f"cannot read the watermarks of {self._where()} from "
                                      f"{self.s.bootstrap_servers}: {e}") from None
                outage = outage or Outage(self.s, f"read the watermarks of {self._where()}")
                outage.wait(e)  # raises once brokerOutageSeconds have passed
                continue
            if outage is not None:
                log.info("%s: Kafka answers again after %.0f s", self._where(), outage.elapsed())
                self.waited_for_broker = True
            return Watermarks(low, high)

    def _out_of_range(self, consumer, tp, err: str) -> bool:
        """The broker does not have ``self.pos``. Returns True when the range is finished."""
        from confluent_kafka import TopicPartition

        r = self.r
        wm = self._watermarks(consumer, tp)
        if not (r.new or self.s.on_missing_offsets == "earliest"):
            raise SourceError(
                f"the broker no longer has offset {self.pos} of {self._where()} (log is now "
                f"[{wm.low}, {wm.high})): {err}. Reprocess from a new checkpoint, or set the source "
                f"option failOnDataLoss=false (on.missing.offsets=earliest) to continue from the earliest "
                f"available offset.")
        if self.pos >= wm.high or wm.low >= r.end:
            if r.new and wm.low >= r.end:  # a piece of a new partition below its log start
                log.info("%s: below the log start %d of a new partition; nothing to read",
                         self._where(), wm.low)
                return True
            log.warning("%s: offsets %d..%d are gone (log is [%d, %d)); skipping %d offsets",
                        self._where(), self.pos, r.end - 1, wm.low, wm.high, r.end - self.pos)
            return True
        if wm.low > self.pos:
            if not r.new:
                log.warning("failOnDataLoss=false: %s skips offsets %d..%d (%d offsets the broker "
                            "no longer has)", self._where(), self.pos, wm.low - 1, wm.low - self.pos)
            self.pos = wm.low
        consumer.assign([TopicPartition(r.topic, r.partition, self.pos)])
        return False

    def _stalled(self, consumer, tp, idle: float) -> bool:
        """No progress for a while: finish if nothing can come, raise after the read timeout."""
        r = self.r
        wm = self._watermarks(consumer, tp)
        if self.waited_for_broker:
            idle = 0.0  # it was waiting for the broker, not stalled (the caller restarts its clock)
        if wm.high <= self.pos < r.end:
            # Everything the broker has is read, and it has less than was planned.
            if self.s.on_missing_offsets == "earliest":
                log.warning("%s: the log ends at %d, before the planned end; skipping offsets %d..%d",
                            self._where(), wm.high, self.pos, r.end - 1)
                return True
            raise SourceError(
                f"the broker no longer has offsets {wm.high}..{r.end - 1} of {self._where()}: its log "
                f"now ends at {wm.high} (truncated, or the topic was recreated). Reprocess from a new "
                f"checkpoint, or set failOnDataLoss=false (on.missing.offsets=earliest) to skip them.")
        if idle >= self.s.read_timeout_seconds:
            raise SourceError(
                f"no progress reading {self._where()} for {idle:.0f}s at offset {self.pos} although the "
                f"broker reports log [{wm.low}, {wm.high}); check the broker's health (raise "
                f"read.timeout.seconds if it is just slow)")
        log.info("%s: waiting at offset %d (log [%d, %d), idle %.0fs)", self._where(), self.pos,
                 wm.low, wm.high, idle)
        return False


def read_range(settings: SourceSettings, r: KafkaRange) -> Iterator:
    """Executor. The records of one range as pyarrow RecordBatches."""
    return _RangeReader(settings, r).run()
