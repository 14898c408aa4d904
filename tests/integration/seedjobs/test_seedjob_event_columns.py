"""The seed events parsed in the JVM (`jobs.lib.source.event_columns.parse_events`) give, record for
record, what the exact parser (`jobs.lib.source.events.parse_record`) gives: the same typed fields, the
same reject reason. A fixed corpus of edge cases plus random mutations of valid records, in one
Spark batch per event type."""

from __future__ import annotations

import json
import os
import random
from datetime import datetime, timedelta, timezone

import pytest

from jobs.lib.source.event_columns import parse_events
from jobs.lib.source.events import AD_CLICK, AD_IMPRESSION, PAGE_VIEW, PROFILE, SETTINGS, parse_record

pytestmark = pytest.mark.integration

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
SEED = int(os.environ.get("KAPPA_TEST_SEED", "20261126"))
VALID = {
    "page view": {"view_id": "pv-1", "member_id": "K", "page": "/jobs", "viewed_at": "2024-05-01T10:15:00Z"},
    "member profile": {"name": "Zoë", "title": "SWE", "zip": "02134"},
    "member settings": {"language": "de", "email_notifications": False, "visibility": "public"},
    "ad impression": {"impression_id": "K", "ad_id": "a", "member_id": "m1", "shown_at": "2024-05-01T10:00:00+02:00"},
    "ad click": {"click_id": "c", "impression_id": "K", "member_id": "m1", "clicked_at": "2024-05-01T08:01:00.5Z"},
}
ODD = [None, 42, 1.5, True, False, "", "x", [], {}, "public", "private", "K", "k2",
       "2024-05-01T10:15:00", "2024-05-01T10:15:00+00:00", "2024-05-01 10:15:00Z", "2024-02-30T00:00:00Z",
       "2024-05-01T24:00:00Z", "2024-05-01T10:15:60Z", "0000-01-01T00:00:00Z", "0001-01-01T00:00:00Z",
       "2024-05-01T10:15:00.1234567Z", "2024-05-01T10:15:00-05:30", "20240501T101500Z", "2024-05-01T10:15Z",
       "a}b", "tab\there", "é\u2028", "\ud800x"]


def mutations(et, rng: random.Random, n: int) -> list[tuple[bytes | None, bytes | None]]:
    base = VALID[et.name]
    out: list[tuple[bytes | None, bytes | None]] = [(b"K", json.dumps(base).encode()), (b"K", None), (None, b"{}"),
                                                    (b"", b"{}"), (b"\xff", b"{}"), (b"K", b"[1]"), (b"K", b"{"),
                                                    (b"K", b'{"a": 1} {"b": 2}'), (b"K", b'{"a": 1, "a": 2}'),
                                                    (b"K", json.dumps(base).encode() + b"  "),
                                                    (b"K", b"  " + json.dumps(base).encode()),
                                                    (b"K", json.dumps(base, ensure_ascii=True).encode()),
                                                    (b"K", json.dumps(base, ensure_ascii=False).encode("utf-16"))]
    fields = list(et.fields) + ["member_id", "impression_id", "extra"]
    for _ in range(n):
        doc = dict(base)
        for _ in range(rng.randint(1, 3)):
            f = rng.choice(fields)
            if rng.random() < 0.2:
                doc.pop(f, None)
            else:
                doc[f] = rng.choice(ODD)
        key = rng.choice([b"K", b"K", b"k2", b"m1"])
        try:
            text = json.dumps(doc, ensure_ascii=rng.random() < 0.3)
            out.append((key, text.encode("utf-8", "surrogatepass")))
        except (TypeError, ValueError):
            continue
    return out


def _instant(v):
    """A parsed (aware) timestamp as epoch microseconds, as the test reads Spark's."""
    return (v - EPOCH) // timedelta(microseconds=1) if isinstance(v, datetime) else v


@pytest.mark.parametrize("et", [PAGE_VIEW, PROFILE, SETTINGS, AD_IMPRESSION, AD_CLICK], ids=lambda e: e.name)
def test_jvm_parsing_equals_the_exact_parser(spark, et):
    rng = random.Random(f"{SEED}-{et.name}")
    records = mutations(et, rng, 300)
    rows = [(k, v, "t", 0, i, datetime(2024, 5, 1, tzinfo=timezone.utc)) for i, (k, v) in enumerate(records)]
    df = spark.createDataFrame(rows, "key binary, value binary, topic string, partition int, offset bigint, "
                                     "timestamp timestamp")
    from pyspark.sql import functions as F

    out = parse_events(df, et)     # timestamps as epoch microseconds: Python cannot hold year 1 in every zone
    out = out.select(*[F.unix_micros(c).alias(c) if t.simpleString() == "timestamp" else F.col(c)
                       for c, t in ((f.name, f.dataType) for f in out.schema.fields)])
    got = {r["offset"]: r.asDict() for r in out.collect()}
    assert sorted(got) == list(range(len(records)))
    valid = 0
    for i, (k, v) in enumerate(records):
        row, error = parse_record(et, k, v)
        g = got[i]
        assert g["error"] == error, (f"seed {SEED}, record {k!r} {v!r}: JVM says {g['error']!r}, the exact "
                                     f"parser {error!r}")
        if error is None:
            valid += 1
            assert {n: g[n] for n in et.fields} == {n: _instant(x) for n, x in row.items()}, (
                f"seed {SEED}, record {k!r} {v!r}")
            assert g["key"] is None and g["value"] is None
        else:
            assert (g["key"], g["value"]) == (k, v) and all(g[n] is None for n in et.fields)
    assert valid >= 3 and valid < len(records)


def test_each_event_value_is_parsed_once_in_the_executed_plan(spark):
    from jobs.lib.source.json_values import PARSE_CALL

    df = spark.createDataFrame([(b"m1", b'{"view_id": "v"}', "t", 0, 0, datetime(2024, 5, 1, tzinfo=timezone.utc))],
                               "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp")
    out = parse_events(df, PAGE_VIEW, key_as="member_id")
    assert out._jdf.queryExecution().executedPlan().toString().count(PARSE_CALL) == 1
    assert [r["error"] for r in out.collect()] == ["field 'member_id' is missing"]
