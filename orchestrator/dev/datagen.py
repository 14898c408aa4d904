"""Member-profile changelogs for tests, the demo and the benchmark.

`generate_changelog` is deterministic for a seed: keys are member ids ("m0000042"), values JSON
profiles (name, title, company, location, updated_at) with unicode names and titles; later
records update existing keys, some are tombstones (null value) and a configurable share is
malformed (invalid JSON, wrong types, a JSON value that is not an object, a missing name, a
profile field given twice).

`produce` writes records to a topic with confluent-kafka, in order. Each record goes to the
partition `partition_for(key)` chooses, so the layout does not depend on librdkafka's partitioner.
`batching=True` produces in large lz4 batches, for the benchmarks' big logs.

The table a changelog should give is not computed here: the tests do that on their own, with no
code shared with the job (tests/oracle/standardize.py).
"""

from __future__ import annotations

import json
import random
import threading
import time
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable, Iterator

from pydantic import BaseModel, ConfigDict

from orchestrator.core.exceptions import BrokerError, ConfigError
from orchestrator.dev.broker import FAST_COMPACTION

__all__ = ["ChangeRecord", "LogRecord", "ProduceStats", "generate_changelog", "member_key", "partition_for",
           "ensure_topic", "topic_partitions", "produce", "produce_live", "iter_log", "wait_for_compaction"]

PROFILE_FIELDS = ("name", "title", "company", "location", "updated_at")

FIRST_NAMES = (
    "Ada", "Alan", "Grace", "Linus", "Margaret", "Ken", "Barbara", "Dennis", "Frances", "Edsger",
    "Katherine", "John", "Radia", "Tim", "Hedy", "Guido", "Anita", "Bjarne", "Shafi", "Donald",
    "José", "Zoë", "François", "Björn", "Søren", "Małgorzata", "Ærin", "Çağla", "Đorđe", "Ines",
    "Юлия", "Дмитрий", "Αλέξανδρος", "Σοφία", "美咲", "太郎", "김민준", "이서연", "Ngọc", "Thảo",
    "अनन्या", "राहुल", "محمد", "فاطمة", "Yağmur", "Ólafur", "Łukasz", "Nuño", "Chloé", "Renée",
)
LAST_NAMES = (
    "Lovelace", "Turing", "Hopper", "Torvalds", "Hamilton", "Thompson", "Liskov", "Ritchie", "Allen",
    "Dijkstra", "Johnson", "McCarthy", "Perlman", "Berners-Lee", "Lamarr", "van Rossum", "Borg",
    "Stroustrup", "Goldwasser", "Knuth", "García", "Müller", "Ødegaard", "Nuñez", "Kowalczyk",
    "Иванова", "Петров", "Παπαδόπουλος", "佐藤", "鈴木", "박", "Nguyễn", "Šťastný", "Øster", "O'Brien",
    "D'Souza", "Łęcka", "Öztürk", "Saint-Exupéry", "Æbelø",
)
# Raw titles as members type them: several spellings per title, some that the v2 rules merge.
TITLES = (
    ("Software Engineer", 14), ("software engineer", 4), ("SWE", 3), ("Software Engineer ", 1),
    ("Software Developer", 5), ("Software Dev", 4), ("software dev", 2), ("Developer", 2),
    ("Senior Software Engineer", 6), ("Sr. Software Engineer", 5), ("SR. SOFTWARE ENGINEER", 1),
    ("Senior SWE", 4), ("sr software eng", 3), ("Sr SWE", 1), ("Senior Software Developer", 1),
    ("Lead Software Engineer", 2), ("Staff Software Engineer", 2), ("Staff Engineer", 1),
    ("Principal Engineer", 1), ("Engineering Manager", 3), ("Eng Manager", 1),
    ("Data Scientist", 4), ("data science", 1), ("Data Engineer", 3), ("Data Analyst", 2),
    ("Product Manager", 4), ("PM", 1), ("Sr. Product Manager", 1), ("UX Designer", 2),
    ("Product Designer", 1), ("DevOps Engineer", 2), ("SRE", 1), ("Site Reliability Engineer", 1),
    ("QA Engineer", 1), ("Test Engineer", 1), ("ML Engineer", 2), ("Machine Learning Engineer", 1),
    ("CTO", 1), ("CEO", 1), ("VP Engineering", 1), ("Technical Recruiter", 1), ("Recruiter", 1),
    ("Account Executive", 1), ("Marketing Manager", 1), ("Co-Founder", 1), ("Nurse", 1),
    ("Teacher", 1), ("Summer Intern", 1), ("Software Engineering Intern", 1),
    ("Ingénieur logiciel", 2), ("Développeur", 1), ("Softwareentwickler", 1),
    ("Ingeniero de Software", 1), ("ソフトウェアエンジニア", 1), ("Инженер-программист", 1),
    ("Chief Happiness Officer 🎉", 1), (None, 2), ("", 1),
)
COMPANIES = (
    ("Acme", 4), ("ACME Corp.", 3), ("Acme Corporation", 3), ("acme inc", 1), ("Globex", 3),
    ("Globex Corporation", 2), ("Initech", 3), ("Initech LLC", 1), ("Hooli", 3), ("Hooli Inc.", 1),
    ("Umbrella Corp", 2), ("Stark Industries", 2), ("Wayne Enterprises", 2), ("Wayne Ent.", 1),
    ("Müller GmbH", 1), ("Mueller GmbH", 1), ("Société Générale", 1), ("Societe Generale", 1),
    ("株式会社サンプル", 1), ("Freelance", 1), ("Self-employed", 1), (None, 2),
)
LOCATIONS = (
    "San Francisco, CA", "New York, NY", "London, UK", "Berlin, Germany", "Paris, France",
    "Zürich, Switzerland", "São Paulo, Brazil", "Kraków, Poland", "東京, 日本", "서울, 대한민국",
    "Москва, Россия", "Αθήνα, Ελλάδα", "Bengaluru, India", "Reykjavík, Iceland", "Toronto, Canada",
    None,
)
#: No "missing key": a compacted topic refuses a record without a key (Apache Kafka answers
#: INVALID_RECORD), so a source topic kappa reprocesses cannot hold one.
MALFORMED_KINDS = ("invalid_json", "wrong_type", "not_object", "missing_name", "duplicate_field")
#: Values with a profile field given twice (ambiguous: the job rejects them, naming the field). The
#: third spells the second "name" with a JSON escape; the last repeats two fields, title first.
DUPLICATE_FIELDS = (
    '{"name": "Twice Titled", "title": "SWE", "company": "Acme", "title": "Senior SWE", "updated_at": "%s"}',
    '{"name": "First Name", "title": "Nurse", "name": "Second Name", "updated_at": "%s"}',
    '{"name": "Escaped Twice", "na\\u006de": "Hidden Name", "title": "CTO", "updated_at": "%s"}',
    '{"name": "Same Company", "company": "Hooli", "company": "Hooli", "updated_at": "%s"}',
    '{"title": "PM", "name": "Both Twice", "title": "PM", "name": "Both Twice", "updated_at": "%s"}',
)
_EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)
_FILLER = "Builds reliable systems; enjoys distributed logs, stream processing and good coffee. "


@dataclass(frozen=True)
class ChangeRecord:
    """One record to produce. kind: "upsert", "tombstone" or one of MALFORMED_KINDS."""

    key: bytes | None
    value: bytes | None
    kind: str


@dataclass(frozen=True)
class LogRecord:
    """One record as read back from the log."""

    key: bytes | None
    value: bytes | None
    partition: int
    offset: int
    timestamp_ms: int


def member_key(n: int) -> bytes:
    return b"m%07d" % n


def partition_for(key: bytes | None, partitions: int, seq: int = 0) -> int:
    """The partition of a key (CRC-32, like librdkafka's consistent partitioner); keyless: round robin."""
    if key is None:
        return seq % partitions
    return zlib.crc32(key) % partitions


def _weighted(pool):
    values = [v for v, _ in pool]
    cum, total = [], 0
    for _, w in pool:
        total += w
        cum.append(total)
    return values, cum


def _js(s: str | None) -> str:
    return json.dumps(s, ensure_ascii=False)


def generate_changelog(records: int | None, keys: int, *, seed: int = 0, delete_share: float = 0.02,
                       malformed_share: float = 0.01, value_size: int | None = None,
                       first_new: bool = True) -> Iterator[ChangeRecord]:
    """Yield `records` change records (forever if None) over `keys` member ids, deterministically.

    The first `keys` records create every member once (when `first_new`), in id order; after that
    each record updates, deletes or garbles a random member. `value_size` pads upserts with a
    `bio` field to about that many bytes (UTF-8), for the benchmark.
    """
    if keys <= 0:
        raise ConfigError(f"the number of member keys must be positive, got {keys}")
    if not (0 <= delete_share and 0 <= malformed_share and delete_share + malformed_share <= 1):
        raise ConfigError(f"delete_share ({delete_share}) and malformed_share ({malformed_share}) must be "
                          f"shares between 0 and 1 that add up to at most 1")
    rng = random.Random(seed)
    titles, title_cum = _weighted(TITLES)
    companies, company_cum = _weighted(COMPANIES)
    names = [f"{f} {l}" for f in FIRST_NAMES for l in LAST_NAMES]
    js_names = [_js(n) for n in names]
    js_titles = [_js(t) for t in titles]
    js_companies = [_js(c) for c in companies]
    js_locations = [_js(loc) for loc in LOCATIONS]
    choices = rng.choices
    i = 0
    while records is None or i < records:
        n = i if (first_new and i < keys) else rng.randrange(keys)
        key = member_key(n)
        updated = (_EPOCH + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%SZ")
        r = rng.random()
        fresh = first_new and i < keys
        if not fresh and r < delete_share:
            yield ChangeRecord(key, None, "tombstone")
        elif not fresh and r < delete_share + malformed_share:
            kind = MALFORMED_KINDS[rng.randrange(len(MALFORMED_KINDS))]
            yield _malformed(kind, key, rng, updated)
        else:
            value = (
                '{"name":' + js_names[rng.randrange(len(names))]
                + ',"title":' + choices(js_titles, cum_weights=title_cum)[0]
                + ',"company":' + choices(js_companies, cum_weights=company_cum)[0]
                + ',"location":' + js_locations[rng.randrange(len(LOCATIONS))]
                + ',"updated_at":"' + updated + '"'
            )
            if value_size:
                pad = value_size - len(value.encode()) - len(',"bio":""}')
                if pad > 0:
                    value += ',"bio":"' + (_FILLER * (pad // len(_FILLER) + 1))[:pad] + '"'
            yield ChangeRecord(key, (value + "}").encode(), "upsert")
        i += 1


def _malformed(kind: str, key: bytes, rng: random.Random, updated: str) -> ChangeRecord:
    if kind == "invalid_json":
        value = ('{"name": "Broken Record", "title": "Software Engineer", "updated_at": "' + updated)[
            : rng.randrange(10, 60)]
        return ChangeRecord(key, value.encode(), kind)
    if kind == "wrong_type":
        value = json.dumps({"name": "Typed Wrong", "title": rng.choice([42, True, ["Engineer"], {"x": 1}]),
                            "company": "Acme", "updated_at": updated})
        return ChangeRecord(key, value.encode(), kind)
    if kind == "not_object":
        return ChangeRecord(key, rng.choice([b'["Software Engineer"]', b'"just a string"', b"null", b"42", b""]),
                            kind)
    if kind == "missing_name":
        value = json.dumps({"title": "Software Engineer", "company": "Acme", "updated_at": updated})
        return ChangeRecord(key, value.encode(), kind)
    if kind == "duplicate_field":
        return ChangeRecord(key, (rng.choice(DUPLICATE_FIELDS) % updated).encode(), kind)
    raise ConfigError(f"unknown malformed kind {kind!r}; expected one of {MALFORMED_KINDS}")


# ---------------------------------------------------------------------------------------------
# Kafka: topic, producer, reading the log back

def ensure_topic(bootstrap: str, topic: str, partitions: int = 4, *, compact: bool = True,
                 config: dict | None = None, timeout: float = 20.0, fast_compaction: bool = False,
                 topic_config: dict | None = None) -> bool:
    """Create the topic; "already exists" is fine. True if it was created.

    Compacted by default. `fast_compaction` adds the settings that have the cleaner compact closed
    segments within seconds (`FAST_COMPACTION`: the demo, the compaction tests); without it the
    broker's segment defaults keep every record for days, which tests whose expected table counts
    every produced record (rejects) rely on. `topic_config` adds or overrides topic settings.

    A topic it created is returned once the broker serves its metadata: KRaft answers CreateTopics when
    the controller has committed the topic, and the broker applies that a moment later, so a describe
    right after the create could read "unknown topic" (the demo failed that way in CI)."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, **(config or {})})
    topic_config = {**({"cleanup.policy": "compact"} if compact else {}),
                    **(FAST_COMPACTION if compact and fast_compaction else {}), **(topic_config or {})}
    fut = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1,
                                        config=topic_config)])[topic]
    try:
        fut.result(timeout)
    except Exception as e:
        err = e.args[0] if e.args else None
        if getattr(err, "code", lambda: None)() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise BrokerError(f"cannot create topic {topic!r} on {bootstrap}: {e}") from None
    _wait_served(admin, bootstrap, topic, partitions, timeout)
    return True


def _wait_served(admin, bootstrap: str, topic: str, partitions: int, timeout: float) -> None:
    """Until the broker's metadata has `topic` with its `partitions` (BrokerError after `timeout` s)."""
    deadline = time.monotonic() + timeout
    seen = None
    while True:
        try:
            t = admin.list_topics(topic, timeout=max(0.1, min(5.0, deadline - time.monotonic()))).topics.get(topic)
            seen = t.error if t is not None and t.error else (len(t.partitions) if t is not None else None)
            if t is not None and t.error is None and len(t.partitions) == partitions:
                return
        except Exception as e:  # a metadata request that timed out: try again until the deadline
            seen = e
        if time.monotonic() >= deadline:
            raise BrokerError(f"topic {topic!r} was created on {bootstrap} but the broker did not serve it within "
                              f"{timeout:g} s (last seen: {seen}); check the broker's log")
        time.sleep(0.05)


def topic_partitions(bootstrap: str, topic: str, config: dict | None = None, timeout: float = 10.0) -> int:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap, **(config or {})}).list_topics(topic, timeout=timeout)
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        raise BrokerError(f"topic {topic!r} not found on {bootstrap}"
                          + (f" ({t.error})" if t is not None and t.error else "")
                          + "; create it first (orchestrator.dev.datagen.ensure_topic)")
    return len(t.partitions)


BATCHING = {"linger.ms": 50, "batch.num.messages": 10000, "batch.size": 1_000_000,
            "compression.type": "lz4", "queue.buffering.max.messages": 500_000,
            "queue.buffering.max.kbytes": 512 * 1024}


class ProduceStats(BaseModel):
    """What `produce` sent: records and key + value bytes, how long it took, records by kind."""

    model_config = ConfigDict(frozen=True)

    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    by_kind: dict[str, int] = {}
    batching: bool = False


def produce(bootstrap: str, topic: str, records: Iterable[ChangeRecord], *, config: dict | None = None,
            batching: bool = False, partitions: int | None = None, timeout: float = 60.0) -> ProduceStats:
    """Produce records in order, each to `partition_for(key)`; BrokerError if any is not delivered.

    `batching=True`: large lz4 batches (the benchmarks' big logs); otherwise librdkafka's defaults.
    """
    from confluent_kafka import Producer

    n_parts = partitions or topic_partitions(bootstrap, topic, config)
    # idempotence keeps the order of a partition's records with several requests in flight
    base = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"}
    settings = {**base, **(BATCHING if batching else {"linger.ms": 5}), **(config or {})}
    producer = Producer(settings)
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None and len(errors) < 5:
            errors.append(f"partition {msg.partition()}: {err}")

    counts = {"records": 0, "bytes": 0}
    by_kind: dict[str, int] = {}
    start = time.perf_counter()

    def send(rec: ChangeRecord, part: int) -> None:
        while True:
            try:
                producer.produce(topic, value=rec.value, key=rec.key, partition=part, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        counts["records"] += 1
        counts["bytes"] += len(rec.value or b"") + len(rec.key or b"")
        by_kind[rec.kind] = by_kind.get(rec.kind, 0) + 1

    for seq, rec in enumerate(records):
        send(rec, partition_for(rec.key, n_parts, seq))
        if counts["records"] % 10000 == 0:
            producer.poll(0)
    _flush(producer, timeout, topic)
    seconds = time.perf_counter() - start
    if errors:
        raise BrokerError(f"{len(errors)}+ records to {topic!r} were not delivered: {'; '.join(errors)}")
    return ProduceStats(seconds=seconds, by_kind=by_kind, batching=batching, **counts)


def _flush(producer, timeout: float, topic: str) -> None:
    left = producer.flush(timeout)
    if left:
        raise BrokerError(f"{left} records to {topic!r} still undelivered after {timeout:.0f}s; "
                          f"is the broker at the configured bootstrap servers up?")


def produce_live(bootstrap: str, topic: str, *, rate: float, stop: threading.Event, keys: int,
                 seed: int = 1, delete_share: float = 0.03, malformed_share: float = 0.0,
                 config: dict | None = None, on_progress: Callable[[int], None] | None = None) -> int:
    """Produce updates of existing members at about `rate` records/s until `stop` is set.

    For the demo's live producer (run it in a thread). Returns the number produced.
    """
    from confluent_kafka import Producer

    n_parts = topic_partitions(bootstrap, topic, config)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **(config or {})})
    gen = generate_changelog(None, keys, seed=seed, delete_share=delete_share,
                             malformed_share=malformed_share, first_new=False)
    sent, start, tick = 0, time.monotonic(), max(1, int(rate / 20))
    while not stop.is_set():
        for _ in range(tick):
            rec = next(gen)
            producer.produce(topic, value=rec.value, key=rec.key,
                             partition=partition_for(rec.key, n_parts, sent))
            sent += 1
        producer.poll(0)
        if on_progress:
            on_progress(sent)
        ahead = sent / rate - (time.monotonic() - start)
        if ahead > 0:
            stop.wait(ahead)
    _flush(producer, 30.0, topic)
    return sent


def iter_log(bootstrap: str, topic: str, *, config: dict | None = None,
             timeout: float = 60.0) -> Iterator[LogRecord]:
    """Every record of the topic from its log start to the current high watermarks, partition by partition."""
    from confluent_kafka import Consumer, TopicPartition

    n_parts = topic_partitions(bootstrap, topic, config)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kappa-datagen-{time.time_ns()}",
                         "enable.auto.commit": False, "enable.partition.eof": False,
                         "isolation.level": "read_committed", **(config or {})})
    try:
        for p in range(n_parts):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            deadline = time.monotonic() + timeout
            furthest = low   # progress is the position passing its furthest point: records that come
            while True:      # again (a fetch reset to the log start) are not progress
                msgs = consumer.consume(10000, 1.0)
                for m in msgs:
                    if m.error():
                        raise BrokerError(f"reading {topic}[{p}]: {m.error()}")
                    yield LogRecord(m.key(), m.value(), m.partition(), m.offset(), m.timestamp()[1])
                # the consumer's position (past a transaction's markers too), or past the last record read
                pos = consumer.position([TopicPartition(topic, p)])[0].offset
                if msgs:
                    pos = max(pos, msgs[-1].offset() + 1)
                if pos >= high:
                    break
                if pos > furthest:
                    furthest, deadline = pos, time.monotonic() + timeout
                elif time.monotonic() > deadline:
                    raise BrokerError(f"reading {topic}[{p}] made no progress for {timeout:.0f}s at offset "
                                      f"{pos} of {high}")
    finally:
        consumer.close()


def wait_for_compaction(bootstrap: str, topic: str, below: int, *, timeout: float = 90.0, poll: float = 2.0,
                        config: dict | None = None) -> tuple[int, bool]:
    """Wait until the log cleaner has compacted `topic`: fewer than `below` records readable.
    Returns (records readable now, compacted). The active segment of a partition is never cleaned:
    a segment closes only when a record arrives `segment.ms` after its first one, so something must
    keep producing (the demo's live producer)."""
    deadline = time.monotonic() + timeout
    while True:
        now = sum(1 for _ in iter_log(bootstrap, topic, config=config))
        if now < below or time.monotonic() > deadline:
            return now, now < below
        time.sleep(poll)
