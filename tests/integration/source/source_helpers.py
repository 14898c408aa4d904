"""Helpers for the source and runtime tests: topics, producers, group offsets, stream runs."""

from __future__ import annotations

import os
from dataclasses import dataclass

from tests.waiting import wait_until

#: Generous bound for anything that waits on Spark: the test machine is shared and loaded.
WAIT_SECONDS = float(os.environ.get("KAPPA_TEST_WAIT_SECONDS", "600"))


@dataclass
class Kafka:
    """Admin, produce and inspect helpers against one broker."""

    bootstrap: str

    def __post_init__(self):
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, name: str, partitions: int = 1) -> str:
        from confluent_kafka.admin import NewTopic

        # retention.ms=-1: tests write historical timestamps, which time retention would delete
        self.admin.create_topics([NewTopic(name, partitions, 1, config={"retention.ms": "-1"})])[name].result(timeout=30)
        self.wait_partitions(name, partitions)
        return name

    def wait_partitions(self, name: str, partitions: int | None) -> None:
        """Until the metadata shows ``partitions`` partitions of the topic (None: topic absent)."""
        def shown() -> int | None:
            t = self.admin.list_topics(timeout=10).topics.get(name)
            return None if t is None or t.error is not None else len(t.partitions)

        wait_until(shown, f"topic {name} with {partitions} partitions (None: no topic)", 60, poll=0.1,
                   done=lambda n: n == partitions)

    def delete_topic(self, name: str) -> None:
        self.admin.delete_topics([name])[name].result(timeout=30)
        self.wait_partitions(name, None)

    def producer(self, **conf):
        from confluent_kafka import Producer

        return Producer({"bootstrap.servers": self.bootstrap, **conf})

    def produce(self, topic: str, records: list[tuple], **conf) -> None:
        """records: (partition, key, value[, headers]); flushed, delivery errors raised."""
        p = self.producer(**conf)
        errors = []

        def on_delivery(err, msg):
            if err is not None:
                errors.append(err)

        for rec in records:
            part, key, value, headers = (tuple(rec) + (None,))[:4]
            p.produce(topic, key=key, value=value, partition=part, headers=headers, on_delivery=on_delivery)
            p.poll(0)
        assert p.flush(60) == 0, "producer could not deliver everything"
        assert not errors, errors

    def group_offsets(self, group: str, topics: tuple[str, ...] | None = None) -> dict:
        """{topic: {partition: offset}} the group committed, on `topics` (default: every topic)."""
        from orchestrator.observe.lag import committed_offsets

        md = self.admin.list_topics(timeout=10).topics
        parts = [(t, p) for t, tm in md.items() if (topics is None and not t.startswith("__")) or
                 (topics is not None and t in topics) for p in tm.partitions]
        out: dict = {}
        for (t, p), off in committed_offsets({"bootstrap.servers": self.bootstrap}, group, parts).items():
            out.setdefault(t, {})[str(p)] = off
        return out

    def wait_group_offsets(self, group: str, expected: dict) -> dict:
        """Group commits land asynchronously: poll until they equal ``expected``; fail after 60 s."""
        return wait_until(lambda: self.group_offsets(group), f"the committed offsets of group {group} to be "
                          f"{expected}", 60, done=lambda got: got == expected)


def read_parquet_rows(path: str) -> list[dict]:
    """Rows of the Parquet files under ``path`` (none: empty), ignoring Spark's _spark_metadata."""
    from pathlib import Path

    import pyarrow.parquet as pq

    files = sorted(Path(path).glob("*.parquet")) if Path(path).is_dir() else []
    rows: list[dict] = []
    for f in files:
        rows.extend(pq.read_table(f).to_pylist())
    return rows
