"""ad_click_join: the joined pairs equal the pairs computed from the produced events (a click joins its
impression when it comes at most 10 minutes after it); clicks outside the bound are not joined."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from jobs import ad_click_join
from orchestrator.dev import seedgen
from seedjob_helpers import JobRun, expected_pairs

pytestmark = pytest.mark.integration

START = datetime(2024, 5, 1, 8, 0, tzinfo=timezone.utc)
BOUND = timedelta(minutes=10)


def click(topic: str, imp: seedgen.SeedRecord, click_id: str, at: datetime) -> seedgen.SeedRecord:
    d = json.loads(imp.value)
    return seedgen.SeedRecord(topic, imp.key, json.dumps(
        {"click_id": click_id, "impression_id": d["impression_id"], "member_id": d["member_id"],
         "clicked_at": seedgen.iso(at)}).encode(), seedgen.to_ms(at))


def shown(imp: seedgen.SeedRecord) -> datetime:
    return datetime.fromisoformat(json.loads(imp.value)["shown_at"])


def test_clicks_join_impressions_within_the_bound(spark, bootstrap, unique, tmp_path):
    imp_topic, clk_topic = f"ad_impressions_{unique}", f"ad_clicks_{unique}"
    seedgen.create_topics(bootstrap, {imp_topic: 2, clk_topic: 2})
    imps, clicks = seedgen.ad_events(imp_topic, clk_topic, seedgen.member_ids(5), 60, START,
                                     click_rate=0.55, late_rate=0.15, late_delay=timedelta(minutes=25))
    clicked = {r.key for r in clicks}
    free = [r for r in imps if r.key not in clicked]
    edge = [
        click(clk_topic, free[0], "clk-before", shown(free[0]) - timedelta(minutes=1)),   # before: no
        click(clk_topic, free[1], "clk-at-bound", shown(free[1]) + BOUND),                # inclusive: yes
        click(clk_topic, free[2], "clk-twice-1", shown(free[2]) + timedelta(minutes=1)),  # two clicks on
        click(clk_topic, free[2], "clk-twice-2", shown(free[2]) + timedelta(minutes=2)),  # one impression
        seedgen.SeedRecord(clk_topic, b"imp-unknown", json.dumps(
            {"click_id": "clk-orphan", "impression_id": "imp-unknown", "member_id": "m0000001",
             "clicked_at": seedgen.iso(START + timedelta(minutes=3))}).encode(),
            seedgen.to_ms(START + timedelta(minutes=3))),
    ]
    at = seedgen.to_ms(START + timedelta(minutes=5))
    bad = [
        seedgen.SeedRecord(imp_topic, b"imp-bad", json.dumps({
            "impression_id": "imp-bad", "member_id": "m1", "shown_at": "2024-05-01T08:05:00Z"}).encode(), at),
        seedgen.SeedRecord(clk_topic, imps[3].key, json.dumps(
            {"click_id": "clk-bad", "impression_id": imps[3].key.decode(), "member_id": "m1",
             "clicked_at": "5 past 8"}).encode(), at),
    ]
    produced = seedgen.produce(bootstrap, seedgen.by_time(imps, clicks, edge, bad))

    job = JobRun(tmp_path, "ad_click_join", f"acj_{unique}", bootstrap, [imp_topic, clk_topic],
                 max_records=40, extra={"bound": "10 minutes"})
    ctx = job.run_in_process(spark, ad_click_join.transform)

    expected = expected_pairs([r for r in produced if r.topic == imp_topic],
                              [r for r in produced if r.topic == clk_topic], BOUND)
    imp_of = {r.key: r for r in imps}
    late = {json.loads(r.value)["click_id"] for r in clicks
            if datetime.fromisoformat(json.loads(r.value)["clicked_at"]) > shown(imp_of[r.key]) + BOUND}
    assert late and not late & {c for _, c in expected}
    ids = {c for _, c in expected}
    assert {"clk-at-bound", "clk-twice-1", "clk-twice-2"} <= ids and not {"clk-before", "clk-orphan"} & ids

    rows = job.table()
    assert len(rows) == len(expected)
    assert {(r["impression_id"], r["click_id"]) for r in rows} == expected
    imp_by_id = {r.key.decode(): json.loads(r.value) for r in imps}
    for r in rows:
        imp = imp_by_id[r["impression_id"]]
        assert (r["ad_id"], r["member_id"], seedgen.iso(r["shown_at"])) == (
            imp["ad_id"], imp["member_id"], imp["shown_at"])
        assert timedelta(0) <= r["clicked_at"] - r["shown_at"] <= BOUND

    rejected = job.rejected()
    assert [(t, p, o) for t, p, o, _ in rejected] == sorted(
        (r.topic, r.partition, r.offset) for r in produced if r.value in {b.value for b in bad})
    assert sorted(e for *_, e in rejected) == [
        "field 'ad_id' is missing",
        "field 'clicked_at' is not an ISO-8601 timestamp with a UTC offset: '5 past 8'"]
    assert ctx.status.data["rows_in"] == len(produced)
    # the backfill is one batch with data, whatever max_records says (then maybe a no-data batch)
    assert len([p for p in job.progress if p.get("numInputRows")]) == 1
