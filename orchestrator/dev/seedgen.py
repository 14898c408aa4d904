"""Seed data for the pattern jobs: page views, member profiles and settings, ad impressions and clicks.

Generators are deterministic (a seed, a start time, counts) and return `SeedRecord`s in the order
they are to be produced; their values follow the schemas in `jobs.lib.source.events`. `produce` writes them
in order (idempotent producer), with each record's timestamp set explicitly, and returns them with
the partition and offset the broker gave them, so a test can compute its expected table from
exactly what was written.
Used by the integration tests and the demo.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Iterable

from orchestrator.core.exceptions import BrokerError

__all__ = ["SeedRecord", "DEMO_TOPICS", "member_ids", "page_views", "member_profiles", "member_settings",
           "ad_events", "by_time", "create_topics", "produce", "produce_demo_events", "to_ms", "iso", "encode",
           "profile_value"]

LANGUAGES = ("en", "de", "fr", "es", "pt", "ja", "zh")
VISIBILITY = ("public", "connections", "private")
PAGES = ("/feed", "/jobs", "/jobs/view/4711", "/in/ana-müller", "/company/acme", "/messaging",
         "/search?q=daten", "/notifications", "/in/李雷", "/learning")
TITLES = ("Software Engineer", "Sr. Data Scientist", "Product Manager", "Ingénieure logiciel",
          "VP Sales", "Account Executive")
COMPANIES = ("Acme Corp", "Initech", "Globex", "Umbrella GmbH", "Stark Industries")
CITIES = ("Mountain View, CA", "Berlin", "São Paulo", "Zürich", "New York, NY", "東京")


@dataclass(frozen=True)
class SeedRecord:
    """One Kafka record to produce; `partition` and `offset` are set by `produce`."""

    topic: str
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    partition: int | None = None
    offset: int | None = None

    def json(self) -> dict | None:
        return None if self.value is None else json.loads(self.value)


def to_ms(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)


def iso(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def encode(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def member_ids(n: int, first: int = 0) -> list[str]:
    """Member ids in the format of `orchestrator.dev.datagen.member_key` ("m0000042"), so that the
    seed events of the demo refer to the members of its profile changelog."""
    return [f"m{i:07d}" for i in range(first, first + n)]


def page_views(topic: str, members: list[str], count: int, start: datetime, *,
               spacing: timedelta = timedelta(seconds=37), seed: int = 1) -> list[SeedRecord]:
    """`count` page views by random members, one every `spacing`, in event-time order.

    The record timestamp equals the event time (`viewed_at`).
    """
    rnd = random.Random(seed)
    out = []
    for i in range(count):
        ts = start + spacing * i
        member = rnd.choice(members)
        out.append(SeedRecord(topic, member.encode(), encode(
            {"view_id": f"pv-{seed}-{i:07d}", "member_id": member, "page": rnd.choice(PAGES),
             "viewed_at": iso(ts)}), to_ms(ts)))
    return out


def profile_value(rnd: random.Random, member: str, zip_code: str | None) -> bytes:
    obj = {"name": f"Member {member}", "title": rnd.choice(TITLES), "company": rnd.choice(COMPANIES),
           "location": rnd.choice(CITIES)}
    if zip_code is not None:
        obj["zip"] = zip_code
    return encode(obj)


def member_profiles(topic: str, members: list[str], start: datetime, *, updates: int = 0,
                    deletes: int = 0, spacing: timedelta = timedelta(seconds=41),
                    seed: int = 2) -> list[SeedRecord]:
    """A profile changelog: one profile per member, then `updates` random re-writes (new ZIP code)
    and `deletes` tombstones, one record every `spacing`. Some profiles carry no ZIP code."""
    rnd = random.Random(seed)
    out, t = [], start

    def zip_for():
        return None if rnd.random() < 0.1 else f"{rnd.randrange(10000, 99999)}"

    for m in members:
        out.append(SeedRecord(topic, m.encode(), profile_value(rnd, m, zip_for()), to_ms(t)))
        t += spacing
    for _ in range(updates):
        m = rnd.choice(members)
        out.append(SeedRecord(topic, m.encode(), profile_value(rnd, m, zip_for()), to_ms(t)))
        t += spacing
    for m in rnd.sample(members, deletes):
        out.append(SeedRecord(topic, m.encode(), None, to_ms(t)))
        t += spacing
    return out


def member_settings(topic: str, members: list[str], start: datetime, *, updates: int = 0,
                    deletes: int = 0, spacing: timedelta = timedelta(seconds=43),
                    seed: int = 3) -> list[SeedRecord]:
    """A settings changelog for the given members (pass a subset to leave some without settings):
    one record per member, then `updates` re-writes and `deletes` tombstones."""
    rnd = random.Random(seed)
    out, t = [], start

    def value():
        obj = {"language": rnd.choice(LANGUAGES), "email_notifications": rnd.random() < 0.5,
               "visibility": rnd.choice(VISIBILITY)}
        if rnd.random() < 0.1:
            del obj["language"]
        return encode(obj)

    for m in members:
        out.append(SeedRecord(topic, m.encode(), value(), to_ms(t)))
        t += spacing
    for _ in range(updates):
        m = rnd.choice(members)
        out.append(SeedRecord(topic, m.encode(), value(), to_ms(t)))
        t += spacing
    for m in rnd.sample(members, deletes):
        out.append(SeedRecord(topic, m.encode(), None, to_ms(t)))
        t += spacing
    return out


def ad_events(impressions_topic: str, clicks_topic: str, members: list[str], count: int,
              start: datetime, *, click_rate: float = 0.5, max_delay: timedelta = timedelta(minutes=9),
              late_rate: float = 0.0, late_delay: timedelta = timedelta(minutes=25),
              spacing: timedelta = timedelta(seconds=20),
              seed: int = 4) -> tuple[list[SeedRecord], list[SeedRecord]]:
    """`count` impressions one every `spacing`; a `click_rate` share of them is clicked up to
    `max_delay` later, a `late_rate` share `late_delay` later (outside a 10-minute join bound).
    Both lists are keyed by impression id and in event-time order."""
    rnd = random.Random(seed)
    imps, clicks = [], []
    for i in range(count):
        shown = start + spacing * i
        imp_id = f"imp-{seed}-{i:06d}"
        member = rnd.choice(members)
        imps.append(SeedRecord(impressions_topic, imp_id.encode(), encode(
            {"impression_id": imp_id, "ad_id": f"ad-{rnd.randrange(20):02d}", "member_id": member,
             "shown_at": iso(shown)}), to_ms(shown)))
        r = rnd.random()
        if r < click_rate:
            delay_ms = rnd.randrange(1000, int(max_delay.total_seconds() * 1000))
            clicked = shown + timedelta(milliseconds=delay_ms)
        elif r < click_rate + late_rate:
            clicked = shown + late_delay
        else:
            continue
        clicks.append(SeedRecord(clicks_topic, imp_id.encode(), encode(
            {"click_id": f"clk-{seed}-{i:06d}", "impression_id": imp_id, "member_id": member,
             "clicked_at": iso(clicked)}), to_ms(clicked)))
    clicks.sort(key=lambda r: r.timestamp_ms)
    return imps, clicks


def by_time(*streams: Iterable[SeedRecord]) -> list[SeedRecord]:
    """Records of several topics merged into one production order, by timestamp (stable)."""
    return sorted((r for s in streams for r in s), key=lambda r: r.timestamp_ms)


def create_topics(bootstrap: str, topics: dict[str, int], *, compacted: Iterable[str] = (),
                  config: dict | None = None, timeout: float = 15.0) -> None:
    """Create topics (name -> partitions); `compacted` ones with cleanup.policy=compact (and the
    broker's segment defaults: the expected tables of the stream-table joins are computed from every
    record produced, so the cleaner must not race them); the others keep their records for ever
    (`retention.ms=-1`: the generated events carry historical timestamps, which the broker's time
    retention would delete at its next check). A topic that already exists is fine."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    compacted = set(compacted)
    admin = AdminClient({"bootstrap.servers": bootstrap, **(config or {})})
    futures = admin.create_topics([
        NewTopic(name, num_partitions=n, replication_factor=1,
                 config={"cleanup.policy": "compact"} if name in compacted else {"retention.ms": "-1"})
        for name, n in topics.items()], operation_timeout=timeout)
    for name, fut in futures.items():
        try:
            fut.result(timeout)
        except Exception as e:
            err = e.args[0] if e.args else None
            if getattr(err, "code", lambda: None)() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise BrokerError(f"cannot create topic {name!r} on {bootstrap}: {e}") from None


def produce(bootstrap: str, records: Iterable[SeedRecord], *, config: dict | None = None,
            timeout: float = 30.0) -> list[SeedRecord]:
    """Produce records in order; return them with their partition and offset.

    A record whose ``partition`` is set goes to that partition (tests that need skewed
    partitions); otherwise the key decides, as for any producer."""
    from confluent_kafka import Producer

    records = list(records)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                         **(config or {})})
    delivered: list[SeedRecord | None] = [None] * len(records)
    errors: list[str] = []

    def on_delivery(i):
        def cb(err, msg):
            if err is not None:
                errors.append(f"{msg.topic()}: {err}")
            else:
                delivered[i] = replace(records[i], partition=msg.partition(), offset=msg.offset())
        return cb

    try:
        for i, r in enumerate(records):
            while True:
                try:
                    where = {} if r.partition is None else {"partition": r.partition}
                    producer.produce(r.topic, key=r.key, value=r.value, timestamp=r.timestamp_ms,
                                     on_delivery=on_delivery(i), **where)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        left = producer.flush(timeout)
    finally:
        getattr(producer, "close", lambda: None)()  # stop librdkafka threads now, not at GC time
    if left or errors:
        raise BrokerError(f"producing to {bootstrap} failed: {left} records not delivered within "
                          f"{timeout:.0f}s; errors: {errors[:3]}")
    return [r for r in delivered if r is not None]


#: Topic names of the seed pipelines in deploy/pipelines.toml (profiles come from orchestrator.dev.datagen).
DEMO_TOPICS = {"page_views": "page_views", "member_settings": "member_settings",
               "ad_impressions": "ad_impressions", "ad_clicks": "ad_clicks"}


def produce_demo_events(bootstrap: str, *, members: int = 1000, views: int = 5000, impressions: int = 2000,
                        start: datetime | None = None, partitions: int = 4,
                        topics: dict[str, str] | None = None, config: dict | None = None,
                        seed: int = 7) -> dict[str, int]:
    """Create the seed pipelines' topics and fill them: page views and settings of the members
    `m0000000`.. (the ids `orchestrator.dev.datagen` gives the profile changelog), ad impressions and
    clicks. Returns records produced per topic."""
    topics = {**DEMO_TOPICS, **(topics or {})}
    start = start or datetime(2024, 5, 1, tzinfo=timezone.utc)
    ids = member_ids(members)
    create_topics(bootstrap, {t: partitions for t in topics.values()},
                  compacted=[topics["member_settings"]], config=config)
    imps, clicks = ad_events(topics["ad_impressions"], topics["ad_clicks"], ids, impressions, start,
                             late_rate=0.1, seed=seed)
    batches = [
        page_views(topics["page_views"], ids, views, start, seed=seed),
        member_settings(topics["member_settings"], ids[: max(1, members * 9 // 10)], start,
                        updates=members // 10, deletes=members // 50, seed=seed),
        by_time(imps, clicks),
    ]
    counts: dict[str, int] = {}
    for records in batches:
        for r in produce(bootstrap, records, config=config):
            counts[r.topic] = counts.get(r.topic, 0) + 1
    return counts
