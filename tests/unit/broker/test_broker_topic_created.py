"""`datagen.ensure_topic` returns a topic it created only once the broker serves its metadata: KRaft answers
CreateTopics when the controller committed the topic, the broker applies it a moment later, and the demo's
describe of the new topic read "unknown topic or partition" in that window (CI, 2026-11-29). A fake admin
client holds the window open for a few metadata requests."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from orchestrator.core.exceptions import BrokerError
from orchestrator.dev import datagen


class Admin:
    """CreateTopics succeeds at once; the metadata shows the topic only from the `lag`-th request on."""

    def __init__(self, lag: int, partitions: int = 4):
        self.lag, self.partitions, self.requests = lag, partitions, 0

    def create_topics(self, topics):
        done = Future()
        done.set_result(None)
        return {t.topic: done for t in topics}

    def list_topics(self, topic, timeout):
        self.requests += 1
        if self.requests < self.lag:
            return SimpleNamespace(topics={topic: SimpleNamespace(error="UNKNOWN_TOPIC_OR_PART", partitions={})})
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=dict.fromkeys(range(self.partitions)))})


def test_a_created_topic_is_returned_once_the_broker_serves_it(monkeypatch):
    admin = Admin(lag=4)
    monkeypatch.setattr("confluent_kafka.admin.AdminClient", lambda conf: admin)
    assert datagen.ensure_topic("127.0.0.1:9", "profiles", 4) is True
    assert admin.requests == 4          # it asked until the topic was there, and not once more


def test_a_topic_the_broker_never_serves_is_one_line_naming_it(monkeypatch):
    monkeypatch.setattr("confluent_kafka.admin.AdminClient", lambda conf: Admin(lag=10**9))
    with pytest.raises(BrokerError) as e:
        datagen.ensure_topic("127.0.0.1:9", "profiles", 4, timeout=0.3)
    assert "\n" not in str(e.value) and "'profiles' was created on 127.0.0.1:9 but the broker did not serve it" in str(e.value)
