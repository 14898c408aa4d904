"""pageviews_hourly: counts per member per hour equal counts computed from the produced records; the
RocksDB state store writes changelog files; a late view is dropped by the watermark, not counted."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from jobs import pageviews_hourly
from orchestrator.dev import seedgen
from seedjob_helpers import JobRun, expected_hourly

pytestmark = pytest.mark.integration

START = datetime(2024, 5, 1, 8, 0, tzinfo=timezone.utc)


def malformed(topic: str) -> list[seedgen.SeedRecord]:
    at = seedgen.to_ms(START + timedelta(minutes=30))

    def view(key: bytes | None, **fields) -> seedgen.SeedRecord:
        d = {"view_id": "pv-bad", "member_id": "m0000001", "page": "/feed",
             "viewed_at": "2024-05-01T08:30:00Z", **fields}
        return seedgen.SeedRecord(topic, key, json.dumps(d).encode(), at)

    return [
        seedgen.SeedRecord(topic, b"m0000001", b"{not json", at),
        view(b"m0000001", viewed_at="2024-05-01T08:30:00"),   # no UTC offset
        view(b"m0000002"),                                      # member_id differs from the key
        seedgen.SeedRecord(topic, b"m0000001", None, at),       # a tombstone in an event topic
        view(None),                                             # no key
    ]


def test_hourly_counts_state_changelog_and_late_views(spark, bootstrap, unique, tmp_path):
    topic = f"page_views_{unique}"
    seedgen.create_topics(bootstrap, {topic: 2})
    members = seedgen.member_ids(6)
    views = seedgen.page_views(topic, members, 180, START, spacing=timedelta(seconds=71))
    bad = malformed(topic)
    produced = seedgen.produce(bootstrap, views[:90] + bad + views[90:])

    job = JobRun(tmp_path, "pageviews_hourly", f"pvh_{unique}", bootstrap, [topic], max_records=50,
                 extra={"watermark": "6 hours"})  # longer than the data spans: nothing is late in run 1
    ctx = job.run_in_process(spark, pageviews_hourly.transform)

    rows = job.table()
    assert {(r["member_id"], r["window_start"]): r["views"] for r in rows} == expected_hourly(produced)
    assert all(r["window_end"] - r["window_start"] == timedelta(hours=1) for r in rows)
    assert len({(r["member_id"], r["window_start"]) for r in rows}) == len(rows)

    reasons = {(r.partition, r.offset): reason for r, reason in zip(produced[90:95], [
        "value is not JSON: Expecting property name enclosed in double quotes",
        "field 'viewed_at' is not an ISO-8601 timestamp with a UTC offset: '2024-05-01T08:30:00'",
        "field 'member_id' is 'm0000001' but the record key is 'm0000002'",
        "null value: page view events have no tombstones",
        "null key: page view records are keyed by member_id",
    ])}
    rejected = job.rejected()
    assert [(t, p, o) for t, p, o, _ in rejected] == sorted((topic, p, o) for p, o in reasons)
    for _, p, o, error in rejected:
        assert error.startswith(reasons[(p, o)])
    assert ctx.status.data["rows_in"] == len(produced) == 185
    assert ctx.status.data["rejects"] == 5
    # the backfill is one batch with data, whatever max_records says (then maybe a no-data batch)
    assert len([p for p in job.progress if p.get("numInputRows")]) == 1

    changelogs = list((job.checkpoint / "state").rglob("*.changelog"))
    assert changelogs, f"no RocksDB changelog files under {job.checkpoint / 'state'}"

    # Run 2 from the same checkpoint: a view a day older than the watermark is dropped as late;
    # an on-time view in the last window is added to the count already in the table (upsert).
    last = max(produced, key=lambda r: r.timestamp_ms)
    last_view = json.loads(last.value)
    late_at, on_time_at = START - timedelta(days=1), datetime.fromisoformat(last_view["viewed_at"])
    more = seedgen.produce(bootstrap, [
        seedgen.SeedRecord(topic, last.key, json.dumps({**last_view, "view_id": "pv-late",
                           "viewed_at": seedgen.iso(late_at)}).encode(), seedgen.to_ms(late_at)),
        seedgen.SeedRecord(topic, last.key, json.dumps({**last_view, "view_id": "pv-again"}).encode(),
                           seedgen.to_ms(on_time_at)),
    ])
    ctx2 = job.run_in_process(spark, pageviews_hourly.transform)

    expected = expected_hourly(produced + more[1:])
    window = (last_view["member_id"], on_time_at.replace(minute=0, second=0, microsecond=0))
    assert expected[window] == expected_hourly(produced)[window] + 1
    assert {(r["member_id"], r["window_start"]): r["views"] for r in job.table()} == expected
    assert len(job.rejected()) == 5
    assert ctx2.status.data["rows_in"] == 2
    dropped = [op.get("numRowsDroppedByWatermark", 0)
               for p in job.progress for op in p.get("stateOperators", [])]
    assert sum(dropped) == 1
