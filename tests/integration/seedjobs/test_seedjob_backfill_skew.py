"""A reprocess over SKEWED partitions (one dense in events per unit of event time, one sparse)
with a small max-records-per-batch equals a batch computation over the same log, and Spark drops
no row by watermark (issue 8 a).

With an even per-partition cap in every batch, the sparse partition ran hours ahead in event
time; the watermark followed it and the dense partition's rows were dropped as late. The
backfill now reads the log in one batch (`backfill=one-batch`); the live tail after it is capped.
The expected tables are computed here with pandas from the produced records, not by job code.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest

from jobs import ad_click_join, pageviews_hourly
from orchestrator.dev import seedgen
from seedjob_helpers import JobRun

pytestmark = pytest.mark.integration

START = datetime(2024, 5, 1, 8, 0, tzinfo=timezone.utc)
CAP = 40  # offsets per micro-batch, split equally between partitions by the source


def dropped_by_watermark(job: JobRun) -> int:
    assert job.progress, "no progress reports"
    return sum(op.get("numRowsDroppedByWatermark", 0) for p in job.progress for op in p.get("stateOperators", []))


def batches_with_data(job: JobRun) -> int:
    return sum(1 for p in job.progress if p.get("numInputRows"))


def records_frame(records) -> pd.DataFrame:
    return pd.DataFrame([{"partition": r.partition, **json.loads(r.value)} for r in records])


def view(topic: str, partition: int, member: str, i: int, at: datetime) -> seedgen.SeedRecord:
    return seedgen.SeedRecord(topic, member.encode(), json.dumps(
        {"view_id": f"pv-{partition}-{i}", "member_id": member, "page": "/feed", "viewed_at": seedgen.iso(at)}
    ).encode(), seedgen.to_ms(at), partition=partition)


def skewed_views(topic: str, hours: int, dense_every: timedelta, sparse_every: timedelta, start=START):
    """Partition 0: members a0-a2, a view every `dense_every`; partition 1: b0-b2, every `sparse_every`."""
    out = []
    for p, every, members in ((0, dense_every, ["a0", "a1", "a2"]), (1, sparse_every, ["b0", "b1", "b2"])):
        n = int(timedelta(hours=hours) / every)
        out += [view(topic, p, members[i % 3], i, start + every * i) for i in range(n)]
    return seedgen.by_time(out)


def hourly_with_pandas(records) -> dict:
    df = records_frame(records)
    df["hour"] = pd.to_datetime(df["viewed_at"], utc=True).dt.floor("h")
    counts = df.groupby(["member_id", "hour"]).size()
    return {(m, h.to_pydatetime()): int(n) for (m, h), n in counts.items()}


def test_pageviews_hourly_reprocess_over_skewed_partitions(spark, bootstrap, unique, tmp_path):
    topic = f"page_views_skew_{unique}"
    seedgen.create_topics(bootstrap, {topic: 2})
    produced = seedgen.produce(bootstrap, skewed_views(topic, 5, timedelta(seconds=30), timedelta(minutes=10)))
    assert {r.partition for r in produced} == {0, 1}

    job = JobRun(tmp_path, "pageviews_hourly", f"pvs_{unique}", bootstrap, [topic], max_records=CAP,
                 extra={"state_partitions": 3})  # default watermark: 2 hours
    job.run_in_process(spark, pageviews_hourly.transform)

    got = {(r["member_id"], r["window_start"]): r["views"] for r in job.table()}
    assert got == hourly_with_pandas(produced)
    assert dropped_by_watermark(job) == 0
    assert batches_with_data(job) == 1  # the backfill: one batch, whatever the cap
    # the pipeline's state partitions reached the query (Spark keeps them in the checkpoint)
    offsets0 = (job.checkpoint / "offsets" / "0").read_text().splitlines()[1]
    assert json.loads(offsets0)["conf"]["spark.sql.shuffle.partitions"] == "3"

    # The live tail from the same checkpoint is capped: 2 * CAP + 10 more views, three batches.
    last = max(r.timestamp_ms for r in produced)
    tail_start = datetime.fromtimestamp(last / 1000, timezone.utc) + timedelta(seconds=1)
    more = seedgen.produce(bootstrap, [view(topic, i % 2, "a0" if i % 2 == 0 else "b0", 10_000 + i,
                                            tail_start + timedelta(seconds=i)) for i in range(2 * CAP + 10)])
    job.run_in_process(spark, pageviews_hourly.transform)
    got = {(r["member_id"], r["window_start"]): r["views"] for r in job.table()}
    assert got == hourly_with_pandas(produced + more)
    assert batches_with_data(job) == 3 and dropped_by_watermark(job) == 0


def impression(topic, partition, i, at):
    iid = f"imp-{partition}-{i}"
    return seedgen.SeedRecord(topic, iid.encode(), json.dumps(
        {"impression_id": iid, "ad_id": f"ad-{i % 7}", "member_id": f"m{partition}{i % 5}",
         "shown_at": seedgen.iso(at)}).encode(), seedgen.to_ms(at), partition=partition)


def click_of(topic, imp, after):
    d = json.loads(imp.value)
    at = datetime.fromisoformat(d["shown_at"]) + after
    return seedgen.SeedRecord(topic, imp.key, json.dumps(
        {"click_id": "clk-" + d["impression_id"], "impression_id": d["impression_id"],
         "member_id": d["member_id"], "clicked_at": seedgen.iso(at)}).encode(), seedgen.to_ms(at),
        partition=imp.partition)


def pairs_with_pandas(impressions, clicks, bound: timedelta) -> set[tuple[str, str]]:
    i = records_frame(impressions)
    c = records_frame(clicks)
    j = c.merge(i, on="impression_id", suffixes=("_c", "_i"))
    shown, clicked = pd.to_datetime(j["shown_at"], utc=True), pd.to_datetime(j["clicked_at"], utc=True)
    j = j[(clicked >= shown) & (clicked <= shown + bound)]
    return set(zip(j["impression_id"], j["click_id"]))


def test_ad_click_join_reprocess_over_skewed_partitions(spark, bootstrap, unique, tmp_path):
    imp_topic, clk_topic = f"ad_impressions_skew_{unique}", f"ad_clicks_skew_{unique}"
    seedgen.create_topics(bootstrap, {imp_topic: 2, clk_topic: 2})
    imps, clicks = [], []
    for p, every, n in ((0, timedelta(seconds=30), 240), (1, timedelta(minutes=15), 8)):  # 2 hours each
        for i in range(n):
            imp = impression(imp_topic, p, i, START + every * i)
            imps.append(imp)
            if i % 2 == 0:
                clicks.append(click_of(clk_topic, imp, timedelta(minutes=2)))
            elif i % 5 == 1:
                clicks.append(click_of(clk_topic, imp, timedelta(minutes=25)))  # beyond the bound
    produced = seedgen.produce(bootstrap, seedgen.by_time(imps, clicks))

    job = JobRun(tmp_path, "ad_click_join", f"acs_{unique}", bootstrap, [imp_topic, clk_topic],
                 max_records=CAP, extra={"bound": "10 minutes"})  # watermarks: 10 minutes each
    job.run_in_process(spark, ad_click_join.transform)

    expected = pairs_with_pandas([r for r in produced if r.topic == imp_topic],
                                 [r for r in produced if r.topic == clk_topic], timedelta(minutes=10))
    assert len(expected) == 124
    rows = job.table()
    assert sorted((r["impression_id"], r["click_id"]) for r in rows) == sorted(expected)
    assert dropped_by_watermark(job) == 0


def latest_with_pandas(records) -> pd.DataFrame:
    """member_id -> last record by offset (keys live in one partition), tombstones kept as None."""
    df = pd.DataFrame([{"member_id": r.key.decode(), "offset": r.offset,
                        "doc": json.loads(r.value) if r.value is not None else None} for r in records])
    return df.sort_values("offset").groupby("member_id").tail(1).set_index("member_id")


def test_profile_settings_join_reprocess_in_one_batch_then_a_capped_tail(spark, bootstrap, unique, tmp_path):
    """The table-table join with the default one-batch backfill and a capped live tail equals the
    join of the latest profile and settings per member, computed here with pandas."""
    from jobs import profile_settings_join

    p_topic, s_topic = f"member_profiles_skew_{unique}", f"member_settings_skew_{unique}"
    seedgen.create_topics(bootstrap, {p_topic: 2, s_topic: 2}, compacted=[p_topic, s_topic])
    members = seedgen.member_ids(10)
    produced = seedgen.produce(bootstrap, seedgen.by_time(
        seedgen.member_profiles(p_topic, members, START, updates=60, deletes=2, spacing=timedelta(seconds=5)),
        seedgen.member_settings(s_topic, members[:7], START, updates=4, deletes=1, spacing=timedelta(minutes=5))))
    job = JobRun(tmp_path, "profile_settings_join", f"psk_{unique}", bootstrap, [p_topic, s_topic],
                 max_records=CAP, extra={"state_partitions": 3})
    job.run_in_process(spark, profile_settings_join.transform)
    assert len([p for p in job.progress if p.get("numInputRows")]) == 1

    t2 = START + timedelta(hours=3)
    produced += seedgen.produce(bootstrap, seedgen.member_profiles(p_topic, members, t2, updates=3 * CAP,
                                                                    spacing=timedelta(seconds=1), seed=11))
    job.run_in_process(spark, profile_settings_join.transform)
    assert len([p for p in job.progress if p.get("numInputRows")]) >= 3  # the tail is capped

    prof = latest_with_pandas([r for r in produced if r.topic == p_topic])
    sett = latest_with_pandas([r for r in produced if r.topic == s_topic])
    prof = prof[prof["doc"].notna()]
    expected = {}
    for member, p in prof.iterrows():
        s = sett["doc"].get(member) if member in sett.index else None
        expected[member] = {
            "name": p["doc"]["name"], "zip": p["doc"].get("zip"), "profile_offset": int(p["offset"]),
            "language": (s or {}).get("language"), "visibility": (s or {}).get("visibility"),
            "settings_offset": int(sett.loc[member, "offset"]) if s is not None else None}
    got = {r["member_id"]: {k: r[k] for k in ("name", "zip", "profile_offset", "language", "visibility",
                                                "settings_offset")} for r in job.table()}
    assert got == expected
