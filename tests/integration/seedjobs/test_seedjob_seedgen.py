"""The seed producers against the embedded broker: partitions and offsets come back from the broker,
and the demo topics hold exactly what was produced (one record per batch keeps watermarks right)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from confluent_kafka import Consumer, TopicPartition

from orchestrator.dev import seedgen

pytestmark = pytest.mark.integration


def end_offsets(bootstrap: str, topic: str, partitions: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "seedgen-test"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in range(partitions))
    finally:
        consumer.close()


def test_demo_events_land_in_their_topics(bootstrap, unique):
    topics = {name: f"{name}_{unique}" for name in seedgen.DEMO_TOPICS}
    counts = seedgen.produce_demo_events(bootstrap, members=20, views=60, impressions=30, partitions=2,
                                         topics=topics)
    assert set(counts) == set(topics.values())
    assert counts[topics["page_views"]] == 60 and counts[topics["ad_impressions"]] == 30
    for topic, n in counts.items():
        assert end_offsets(bootstrap, topic, 2) == n, topic


def test_produce_returns_broker_positions(bootstrap, unique):
    topic = f"positions_{unique}"
    seedgen.create_topics(bootstrap, {topic: 2})
    seedgen.create_topics(bootstrap, {topic: 2})  # already exists: fine
    records = seedgen.page_views(topic, seedgen.member_ids(3), 12, datetime(2024, 5, 1, tzinfo=timezone.utc))
    out = seedgen.produce(bootstrap, records)
    assert [r.value for r in out] == [r.value for r in records]
    for p in (0, 1):
        offsets = [r.offset for r in out if r.partition == p]
        assert offsets == list(range(len(offsets)))
    for key in {r.key for r in out}:  # a key lives in one partition
        assert len({r.partition for r in out if r.key == key}) == 1
