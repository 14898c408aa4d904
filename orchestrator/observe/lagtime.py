"""Lag in time: how old the oldest record a version has not processed yet is.

Records say how far behind a job is in work; seconds say how stale its table is, which is what a
reader feels (Materialize gates its cutover on wall-clock lag). For every partition whose next
offset is below the log end, the record at that offset (or the first one after it: a compacted
log has gaps) is fetched with a throwaway consumer that never commits, and its Kafka timestamp
is read. The version's lag in seconds is `now - the oldest of those timestamps` (at least 0);
0 when nothing is left to read. It is unknown (None), never 0, when any lagging partition's
record could not be fetched in time, has no timestamp, or the broker is away: that is what the
callers' "unknown never counts" rules expect. Nothing here raises for a broker problem.
"""

from __future__ import annotations

import logging
import time
from typing import Iterable

__all__ = ["GROUP_ID", "oldest_unread_age", "record_timestamps"]

log = logging.getLogger(__name__)

#: The consumer group named by the fetches (librdkafka wants one); it never commits anything.
GROUP_ID = "kappa-lag-seconds"


def record_timestamps(k, positions: dict[tuple[str, int], int], *, timeout: float,
                      ) -> dict[tuple[str, int], float | None] | None:
    """{(topic, partition): unix seconds of the first record at or after the offset, or None}.

    None for the whole answer when the broker cannot be reached (every broker down, or no
    bootstrap servers configured); a partition whose record did not arrive within `timeout`
    is None. A partition whose log holds no data record past the offset (only transaction
    markers) is left out: nothing there is waiting to be processed.
    """
    if not positions:
        return {}
    try:
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        down: list[str] = []

        def on_error(err) -> None:
            if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._AUTHENTICATION):
                down.append(str(err))

        conf = {**k.kafka_config(), "group.id": GROUP_ID, "client.id": "kappa-lag-seconds",
                "enable.auto.commit": False, "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest", "enable.partition.eof": True,
                "max.partition.fetch.bytes": 65536, "fetch.max.bytes": 1 << 20, "log_level": 0,
                "error_cb": on_error}
        consumer = Consumer(conf)
    except Exception as e:  # noqa: BLE001 - no settings, bad settings: the age is unknown
        log.debug("cannot make a consumer for lag in seconds: %s", e)
        return None
    found: dict[tuple[str, int], float | None] = {}
    finished: set[tuple[str, int]] = set()
    try:
        consumer.assign([TopicPartition(t, p, int(o)) for (t, p), o in positions.items()])
        deadline = time.monotonic() + timeout
        while len(finished) < len(positions) and not down and time.monotonic() < deadline:
            for m in consumer.consume(max(1, len(positions)), 0.02):
                tp = (m.topic(), m.partition())
                if tp in finished or tp not in positions:
                    continue
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        finished.add(tp)
                    continue
                kind, ms = m.timestamp()
                found[tp] = None if kind == 0 or ms is None or ms < 0 else ms / 1000.0  # 0: not available
                finished.add(tp)
    except Exception as e:  # noqa: BLE001 - a fetch problem makes the age unknown, never an error
        log.debug("cannot fetch records for lag in seconds: %s", e)
        return None
    finally:
        try:
            consumer.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass
    if down:
        return None
    for tp in positions:
        if tp not in finished:
            found[tp] = None
    return found


def oldest_unread_age(k, details: Iterable, *, now: float, timeout: float) -> float | None:
    """Seconds since the oldest record not yet processed was written (0 when none is left).

    `details` are the `PartitionLag`s of a reading; only partitions with `lag > 0` are fetched.
    """
    positions = {(d.topic, d.partition): d.next_offset for d in details if d.lag > 0}
    if not positions:
        return 0.0
    stamps = record_timestamps(k, positions, timeout=timeout)
    if stamps is None or any(ts is None for ts in stamps.values()):
        return None
    if not stamps:
        return 0.0
    return max(0.0, now - min(stamps.values()))
