"""Issue 9, case 16: the source rides out an unreachable broker for brokerOutageSeconds, and still
fails bad input at once (no services: a fake admin client and a fake consumer).

The driver side (`Broker`: metadata, watermarks) runs on a fake clock, so a minute-long outage
costs no real time; the executor side (`read_range`) runs on the real clock for a few seconds,
because what it must get right is that waiting for the broker does not count as a stalled read.
The real broker, paused under a running standardize job, is tests/integration/control/
test_control_supervision.py.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import confluent_kafka
import confluent_kafka.admin
import pytest
from confluent_kafka import KafkaError, KafkaException

from jobs.lib.kafka import KafkaRange, SourceSettings, outage, read_range, reading
from jobs.lib.kafka.broker import Broker
from jobs.lib.kafka.options import DEFAULT_BROKER_OUTAGE_SECONDS
from orchestrator.core.exceptions import SourceError
from test_source_reader import FakeConsumer, FakeError, FakeLog, FakeMsg, offsets_of  # noqa: I001

pytestmark = pytest.mark.timeout(60)


class FakeClock:
    """`monotonic()` and `sleep()` of the outage module: sleeping advances the clock, no real wait."""

    def __init__(self):
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def __getattr__(self, name):
        return getattr(time, name)


def refused() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: Local: Broker transport failure"))


def timed_out() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to query partition leaders: Local: Timed out"))


def leaderless() -> KafkaException:
    """What list_offsets answers while a single broker restarts: its partitions have no leader yet."""
    return KafkaException(KafkaError(KafkaError._NOENT, "Failed to query partition leaders: No leaders found"))


class FakeAdmin:
    """Enough of AdminClient: `down` calls fail as an unreachable broker would (each costs the
    request's timeout on the clock), then it answers; `error` makes every call fail with it."""

    def __init__(self, clock: FakeClock, topics=("t",), down: int = 0, error=None, offsets_error=timed_out):
        self.clock, self.topics, self.down, self.error = clock, set(topics), down, error
        self.offsets_error = offsets_error
        self.calls = 0

    def _fail(self, exc, timeout):
        self.clock.now += timeout
        raise exc

    def list_topics(self, timeout=None):
        self.calls += 1
        if self.error is not None:
            raise self.error
        if self.down > 0:
            self.down -= 1
            self._fail(refused(), timeout)
        parts = {0: None, 1: None}
        return SimpleNamespace(topics={t: SimpleNamespace(partitions=parts, error=None) for t in self.topics})

    def list_offsets(self, req, isolation_level=None, request_timeout=None):
        self.calls += 1
        failing = self.down > 0
        if failing:
            self.down -= 1
            self.clock.now += request_timeout

        def future(tp):
            f = SimpleNamespace()

            def result():
                if failing:
                    raise self.offsets_error()
                return SimpleNamespace(offset=10 * (tp.partition + 1))
            f.result = result
            return f
        return {tp: future(tp) for tp in req}


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(outage, "time", c)
    import jobs.lib.kafka.broker as broker_mod

    monkeypatch.setattr(broker_mod, "time", c)
    return c


def broker(monkeypatch, admin: FakeAdmin, **opts) -> Broker:
    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", lambda conf: admin)
    return Broker(SourceSettings.from_options({"kafka.bootstrap.servers": "fake:1", "subscribe": "t", **opts}))


def test_metadata_rides_out_a_minute_long_outage(monkeypatch, clock):
    """The old code gave up after 3 attempts (a few seconds of connection refused)."""
    admin = FakeAdmin(clock, down=8)   # 8 metadata requests of 10 s each, plus the backoff
    b = broker(monkeypatch, admin)
    assert b.partitions(required=True) == [("t", 0), ("t", 1)]
    assert admin.calls == 9
    assert clock.now >= 60, f"the outage lasted only {clock.now} s"
    assert max(clock.slept) <= outage.MAX_BACKOFF_SECONDS and clock.slept == sorted(clock.slept)


def test_watermarks_ride_out_requests_timing_out(monkeypatch, clock):
    admin = FakeAdmin(clock, down=5)   # a paused broker: every request times out after 15 s
    b = broker(monkeypatch, admin)
    wms = b.watermarks([("t", 0), ("t", 1)])
    assert {tp: (w.low, w.high) for tp, w in wms.items()} == {("t", 0): (10, 10), ("t", 1): (20, 20)}
    assert clock.now >= 60


def test_watermarks_ride_out_partitions_without_a_leader(monkeypatch, clock):
    """A broker stopped and started again: its partitions have no leader for a while (`_NOENT`, "No
    leaders found"). The job used to fail after 3 attempts (seen on Apache Kafka)."""
    admin = FakeAdmin(clock, down=6, offsets_error=leaderless)
    b = broker(monkeypatch, admin)
    wms = b.watermarks([("t", 0), ("t", 1)])
    assert {tp: (w.low, w.high) for tp, w in wms.items()} == {("t", 0): (10, 10), ("t", 1): (20, 20)}
    assert admin.down == 0 and admin.calls > 6   # every leaderless answer was waited out


def test_a_client_that_keeps_the_leaders_unknown_is_replaced(monkeypatch, clock):
    """A client that saw the broker restart can answer "No leaders found" for good; the source asks a
    fresh one after each wait (the old code retried the stale client until brokerOutageSeconds)."""
    stale = FakeAdmin(clock, down=10**6, offsets_error=leaderless)
    fresh = FakeAdmin(clock)
    clients = iter([stale, fresh])
    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", lambda conf: next(clients))
    b = Broker(SourceSettings.from_options({"kafka.bootstrap.servers": "fake:1", "subscribe": "t"}))
    wms = b.watermarks([("t", 0), ("t", 1)])
    assert {tp: (w.low, w.high) for tp, w in wms.items()} == {("t", 0): (10, 10), ("t", 1): (20, 20)}
    assert stale.calls == 1 and clock.now < 60


def test_an_outage_longer_than_broker_outage_seconds_fails_with_the_unavailable_error(monkeypatch, clock):
    admin = FakeAdmin(clock, down=10**6)
    b = broker(monkeypatch, admin, brokerOutageSeconds="45")
    with pytest.raises(SourceError) as e:
        b.partitions(required=False)
    msg = str(e.value)
    assert msg.startswith(outage.UNAVAILABLE) and "\n" not in msg
    assert "cannot read topic metadata from Kafka at fake:1" in msg and "brokerOutageSeconds=45" in msg
    assert 45 <= clock.now <= 45 + 10 + outage.MAX_BACKOFF_SECONDS


def test_unknown_topic_once_the_broker_answers_fails_at_once(monkeypatch, clock):
    admin = FakeAdmin(clock, topics=("other",))
    b = broker(monkeypatch, admin)
    with pytest.raises(SourceError, match=r"topic 't' does not exist on fake:1 .*Topics there: \['other'\]"):
        b.partitions(required=True)
    assert admin.calls == 1 and clock.slept == []


@pytest.mark.parametrize("code", [KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._AUTHENTICATION,
                                  KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError._INVALID_ARG])
def test_authentication_and_bad_settings_fail_at_once(monkeypatch, clock, code):
    admin = FakeAdmin(clock, error=KafkaException(KafkaError(code, "refused by the broker")))
    b = broker(monkeypatch, admin)
    with pytest.raises(SourceError, match=r"^cannot read topic metadata from Kafka at fake:1: .*refused by the "
                                          r"broker.*check the kafka\.\* security options"):
        b.partitions(required=True)
    assert admin.calls == 1 and clock.slept == []


def test_broker_outage_seconds_option_names_default_and_bad_values():
    base = {"kafka.bootstrap.servers": "h:1", "subscribe": "t"}
    assert SourceSettings.from_options(base).broker_outage_seconds == DEFAULT_BROKER_OUTAGE_SECONDS >= 60
    assert SourceSettings.from_options({**base, "brokerOutageSeconds": "300"}).broker_outage_seconds == 300.0
    assert SourceSettings.from_options({**base, "broker.outage.seconds": "0"}).broker_outage_seconds == 0.0
    assert SourceSettings.from_options({**base, "brokeroutageseconds": "7.5"}).broker_outage_seconds == 7.5
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(SourceError, match=r"^source option brokerOutageSeconds must be"):
            SourceSettings.from_options({**base, "brokerOutageSeconds": bad})
    with pytest.raises(SourceError, match="name the same option"):
        SourceSettings.from_options({**base, "brokerOutageSeconds": "5", "broker.outage.seconds": "6"})


# --- the executor side: one range read through an outage ------------------------------------

class OutageConsumer(FakeConsumer):
    """A FakeConsumer whose broker is unreachable for the first `down` watermark requests: fetches
    return a transport error, then nothing, until the watermarks answer again."""

    down = 0

    def consume(self, n, timeout):
        if OutageConsumer.down > 0:
            time.sleep(0.01)
            return [FakeMsg(self.fetch, err=FakeError(KafkaError._TRANSPORT, "Broker transport failure"))]
        return super().consume(n, timeout)

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        if OutageConsumer.down > 0:
            OutageConsumer.down -= 1
            raise KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN,
                                            "Failed to get watermark offsets: Local: All broker connections are down"))
        return super().get_watermark_offsets(tp, timeout, cached)


@pytest.fixture
def outage_log(monkeypatch):
    log = FakeLog({o: (b"k%d" % o, b"v%d" % o) for o in range(100)})
    monkeypatch.setattr(confluent_kafka, "Consumer", lambda conf: OutageConsumer(log, conf))
    monkeypatch.setattr(reading._RangeReader, "STALL_CHECK_SECONDS", 0.05)
    monkeypatch.setattr(OutageConsumer, "down", 0)
    return log


def settings(**opts) -> SourceSettings:
    return SourceSettings.from_options({"bootstrap.servers": "fake:1", "topics": "t", **opts})


def test_a_range_read_waits_for_the_broker_and_the_wait_is_not_a_stall(outage_log):
    """Three failed watermark requests cost 0.5 + 1 + 2 s of backoff, three times the read timeout:
    the old reader failed at the first one, and a reader that counted the wait as idle time would
    fail with "no progress" right after the broker came back."""
    OutageConsumer.down = 3
    t0 = time.monotonic()
    batches = list(read_range(settings(**{"read.timeout.seconds": "1", "brokerOutageSeconds": "30"}),
                              KafkaRange("t", 0, 0, 100)))
    assert time.monotonic() - t0 >= 3.0 and OutageConsumer.down == 0
    import pyarrow as pa

    assert offsets_of(pa.Table.from_batches(batches)) == list(range(100))
    assert all(c.closed for c in outage_log.consumers)


def test_a_range_read_fails_once_the_outage_outlasts_broker_outage_seconds(outage_log):
    OutageConsumer.down = 10**6
    with pytest.raises(SourceError) as e:
        list(read_range(settings(**{"brokerOutageSeconds": "1"}), KafkaRange("t", 0, 0, 100)))
    msg = str(e.value)
    assert msg.startswith(outage.UNAVAILABLE) and "topic t partition 0 range [0, 100)" in msg
    assert "brokerOutageSeconds=1" in msg
    assert all(c.closed for c in outage_log.consumers)


def test_a_watermark_error_that_is_not_an_outage_still_fails_at_once(outage_log, monkeypatch):
    def unknown(self, tp, timeout=None, cached=False):
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not authorized"))

    monkeypatch.setattr(OutageConsumer, "get_watermark_offsets", unknown)
    monkeypatch.setattr(OutageConsumer, "consume", lambda self, n, timeout: time.sleep(0.01) or [])
    t0 = time.monotonic()
    with pytest.raises(SourceError, match=r"^cannot read the watermarks of topic t partition 0 .*not authorized"):
        list(read_range(settings(), KafkaRange("t", 0, 0, 100)))
    assert time.monotonic() - t0 < 2
