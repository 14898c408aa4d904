"""Commit a version's progress to its Kafka consumer group, so Kafka's own tools show its lag.

Spark's Kafka source never commits offsets to a consumer group: the Spark checkpoint is the truth
about what a query has processed. kappa commits each finished micro-batch's end offsets to the
version's group (`jobs.lib.runtime.context`), so ``kafka-consumer-groups --describe`` shows the lag
that kappa shows. A failed commit is logged by the caller and never fails the job.
"""

from __future__ import annotations

from typing import Mapping

from jobs.lib.source.offsets import offsets_to_map

__all__ = ["commit_group_offsets"]


def commit_group_offsets(bootstrap_servers: str, group_id: str, offsets: Mapping[str, Mapping[str, int]],
                         kafka_config: Mapping[str, str] | None = None, timeout: float = 30.0) -> None:
    """Commit Spark offset JSON (``{"topic": {"0": 120}}``, next offsets) to `group_id`, synchronously.

    `kafka_config` holds the client settings in librdkafka's names (the version's 0600 file)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    conf = {"client.id": "kappa-group-commit", "log_level": 3, **{k: str(v) for k, v in (kafka_config or {}).items()},
            "bootstrap.servers": bootstrap_servers, "group.id": group_id, "enable.auto.commit": False,
            "socket.timeout.ms": int(timeout * 1000)}
    consumer = Consumer(conf)
    try:
        tps = [TopicPartition(t, p, o) for (t, p), o in sorted(offsets_to_map(offsets).items())]
        done = consumer.commit(offsets=tps, asynchronous=False)
        bad = [f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in done or [] if tp.error is not None]
        if bad:
            raise KafkaException(f"commit to consumer group {group_id} failed for {', '.join(bad)}")
    finally:
        consumer.close()
