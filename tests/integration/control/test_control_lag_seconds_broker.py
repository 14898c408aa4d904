"""Lag in seconds against the embedded broker: the Kafka timestamps of the oldest unprocessed records."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer

from orchestrator.context import Kappa
from orchestrator.core.settings import Settings
from orchestrator.observe.lag import PartitionLag
from orchestrator.observe.lagtime import oldest_unread_age, record_timestamps
from tests.integration.source.source_helpers import Kafka

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000  # ms


@pytest.fixture
def topic(bootstrap):
    """Two partitions; record i of partition p has the timestamp T0 + p * 100 s + i s ."""
    name = Kafka(bootstrap).create_topic(f"lagsec_{uuid.uuid4().hex[:8]}", 2)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for p in (0, 1):
        for i in range(5):
            producer.produce(name, value=b"x", key=str(i).encode(), partition=p, timestamp=T0 + p * 100_000 + i * 1000)
            assert producer.flush(20) == 0
    return name


def test_record_timestamps_at_the_next_offsets(tmp_path, bootstrap, topic):
    k = Kappa(Settings(home=tmp_path / "home", bootstrap_servers=bootstrap), pipelines={})
    stamps = record_timestamps(k, {(topic, 0): 2, (topic, 1): 4}, timeout=10)
    assert stamps == {(topic, 0): (T0 + 2000) / 1000, (topic, 1): (T0 + 104_000) / 1000}
    details = [PartitionLag(topic=topic, partition=0, log_start=0, log_end=5, next_offset=3, lag=2, source="checkpoint"),
               PartitionLag(topic=topic, partition=1, log_start=0, log_end=5, next_offset=5, lag=0, source="checkpoint")]
    now = T0 / 1000 + 60.0
    assert oldest_unread_age(k, details, now=now, timeout=10) == 57.0   # partition 0's record 3, 57 s before now
    # the end of the log: nothing to wait for there, so it is left out, not unknown
    assert record_timestamps(k, {(topic, 1): 5}, timeout=2) == {}


def test_a_broker_that_is_away_gives_unknown(tmp_path):
    k = Kappa(Settings(home=tmp_path / "home", bootstrap_servers="127.0.0.1:9"), pipelines={})
    assert record_timestamps(k, {("t", 0): 0}, timeout=5) is None
