"""The seed jobs' shared plumbing without Spark: the micro-batch writer's split and write order,
job options and topic roles, and the seed generators' output."""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from jobs.lib.events import AD_CLICK, AD_IMPRESSION, PAGE_VIEW, PROFILE, SETTINGS, parse_record
from jobs.lib.seedjob import SeedBatchWriter, job_options, job_topics, start_query, state_partitions
from jobs.pageviews_hourly import OUTPUT_SCHEMA as HOURLY_SCHEMA
from jobs.profile_settings_join import OUTPUT_SCHEMA as JOIN_SCHEMA
from orchestrator.dev import seedgen
from orchestrator.core.exceptions import ConfigError

START = datetime(2024, 5, 1, 8, 0, tzinfo=timezone.utc)


class FakeSink:
    table_uri, rejects_uri, app_id = "/nowhere/t", "/nowhere/t__rejects", "kappa.p.v1"

    def __init__(self, committed=False):
        self.calls = []
        self._committed = committed

    def committed(self, batch_id):
        return self._committed

    def write_rejects(self, batch_id, rejects):
        self.calls.append(("rejects", batch_id, rejects.num_rows))
        return argparse.Namespace(skipped=False)

    def upsert(self, batch_id, table, key_columns, deleted_column, end_offsets=None):
        self.calls.append(("upsert", batch_id, table, key_columns, end_offsets))

    def append(self, batch_id, table, end_offsets=None):
        self.calls.append(("append", batch_id, table, end_offsets))


def hourly_batch() -> pa.Table:
    ts = pa.array([START, None, None, None], pa.timestamp("us", tz="UTC"))
    return pa.table({
        "member_id": ["m1", None, None, None], "window_start": ts, "window_end": ts,
        "views": pa.array([3, None, None, None], pa.int64()),
        "key": pa.array([None, b"k", None, None], pa.binary()),
        "value": pa.array([None, b"v", None, None], pa.binary()),
        "topic": [None, "pv", None, None], "partition": pa.array([None, 1, None, None], pa.int32()),
        "offset": pa.array([None, 7, None, None], pa.int64()),
        "error": [None, "bad", None, None], "input_rows": pa.array([None, None, 10, 5], pa.int64()),
    })


def test_writer_splits_rows_rejects_and_counts(monkeypatch):
    import jobs.lib.seedjob

    monkeypatch.setattr(jobs.lib.seedjob, "count_rows", lambda uri: 4)
    sink, reported = FakeSink(), []
    writer = SeedBatchWriter(sink, HOURLY_SCHEMA, mode="upsert", key_columns=["member_id", "window_start"],
                             end_offsets=lambda b: {"pv": {"0": b}},
                             on_batch=lambda *a: reported.append(a))
    rows, rejects, rows_in = writer.write(hourly_batch(), 3)
    assert rows.schema == HOURLY_SCHEMA.append(pa.field("_deleted", pa.bool_()))
    assert rows.to_pylist() == [{"member_id": "m1", "window_start": START, "window_end": START, "views": 3,
                                 "_deleted": False}]
    assert rejects.column_names == ["key", "value", "topic", "partition", "offset", "error", "batch_id"]
    assert rejects.to_pylist() == [{"key": b"k", "value": b"v", "topic": "pv", "partition": 1, "offset": 7,
                                    "error": "bad", "batch_id": 3}]
    assert rows_in == 15
    assert [c[0] for c in sink.calls] == ["rejects", "upsert"]  # rejects first, output second
    assert sink.calls[1][3:] == (["member_id", "window_start"], {"pv": {"0": 3}})
    assert reported == [(3, 15, 1, 1, 5)]


def test_writer_upsert_keeps_deletes_and_append_drops_nothing():
    table = pa.table({**{f.name: pa.nulls(2, f.type) for f in JOIN_SCHEMA},
                      "_deleted": [True, False], "key": pa.nulls(2, pa.binary()),
                      "value": pa.nulls(2, pa.binary()), "topic": pa.nulls(2, pa.string()),
                      "partition": pa.nulls(2, pa.int32()), "offset": pa.nulls(2, pa.int64()),
                      "error": pa.nulls(2, pa.string()), "input_rows": pa.nulls(2, pa.int64())})
    table = table.set_column(0, "member_id", pa.array(["gone", "here"]))
    rows, _, _ = SeedBatchWriter(FakeSink(), JOIN_SCHEMA, mode="upsert").split(table, 0)
    assert rows.column("_deleted").to_pylist() == [True, False]
    rows, _, _ = SeedBatchWriter(FakeSink(), JOIN_SCHEMA, mode="append").split(table, 0)
    assert rows.schema == JOIN_SCHEMA and rows.num_rows == 2


def test_writer_replay_runs_the_plan_but_writes_nothing():
    ran = []

    class Write:
        def format(self, name):
            ran.append(name)
            return self

        def mode(self, mode):
            return self

        def save(self):
            ran.append("saved")

    df = argparse.Namespace(write=Write(), toArrow=lambda: pytest.fail("a replayed batch was collected"))
    sink, reported = FakeSink(committed=True), []
    writer = SeedBatchWriter(sink, HOURLY_SCHEMA, mode="upsert", on_batch=lambda *a: reported.append(a))
    writer(df, 9)
    assert ran == ["noop", "saved"] and sink.calls == [] and writer.skipped == [9]
    assert reported == [(9, 0, 0, 0)]


def ctx(topics: str, extra: dict | None = None):
    return argparse.Namespace(args=argparse.Namespace(topics_list=topics.split(",")), extra=extra or {})


def test_job_topics_and_options_say_what_is_expected():
    assert job_topics(ctx("a,b"), ("x", "y"), "j") == ["a", "b"]
    with pytest.raises(ConfigError) as e:
        job_topics(ctx("a"), ("ad impressions", "ad clicks"), "ad_click_join")
    assert str(e.value) == (
        "job ad_click_join reads 2 topic(s) in this order: ad impressions, ad clicks; got "
        "--topics 'a': pass --topics <ad impressions>,<ad clicks>")
    options = job_options(ctx("a", {"watermark": " 3 hours", "source_options": {"x": 1}}),
                          {"window": "1 hour", "watermark": "2 hours"}, "j")
    assert options == {"window": "1 hour", "watermark": "3 hours"}
    with pytest.raises(ConfigError, match=r"job j has no option 'wm' in --extra; known options: watermark"):
        job_options(ctx("a", {"wm": "1 hour"}), {"watermark": "2 hours"}, "j")
    with pytest.raises(ConfigError, match=r"must be a duration such as \"10 minutes\""):
        job_options(ctx("a", {"watermark": "1 hour; DROP"}), {"watermark": "2 hours"}, "j")


def test_state_partitions_is_a_pipeline_option_applied_when_the_query_starts():
    """`[pipelines.X.options] state_partitions = 4` reaches the job as --extra; the query starts
    with that many shuffle (state) partitions, and the shared session keeps its own number."""
    assert state_partitions(ctx("a"), "j") is None
    assert state_partitions(ctx("a", {"state_partitions": 4}), "j") == 4
    assert job_options(ctx("a", {"state_partitions": "6", "watermark": "3 hours"}),
                       {"watermark": "2 hours"}, "j") == {"watermark": "3 hours"}
    for bad in (0, -1, "two", 1.5, True):
        with pytest.raises(ConfigError, match=r"--extra option 'state_partitions' of job j must be a positive "
                                              r"integer \(the pipeline's options.state_partitions\), got"):
            job_options(ctx("a", {"state_partitions": bad}), {}, "j")

    class Conf(dict):
        def get(self, k):
            return self[k]

        def set(self, k, v):
            self[k] = v

    class Writer:  # records the session's setting at start()
        def __getattr__(self, name):
            return lambda *a, **k: self

        def start(self):
            return conf["spark.sql.shuffle.partitions"]

    conf = Conf({"spark.sql.shuffle.partitions": "2"})
    c = ctx("a", {"state_partitions": 5})
    c.spark = argparse.Namespace(conf=conf)
    c.args.pipeline, c.args.version, c.args.checkpoint = "p", 1, "/cp"
    c.trigger_kwargs = lambda: {"availableNow": True}
    assert start_query(c, argparse.Namespace(writeStream=Writer()), None, output_mode="update", job="j") == "5"
    assert conf["spark.sql.shuffle.partitions"] == "2"


def test_seed_generators_are_deterministic_and_valid():
    members = seedgen.member_ids(4)
    assert members[0] == "m0000000"
    views = seedgen.page_views("pv", members, 30, START)
    assert views == seedgen.page_views("pv", members, 30, START)
    assert all(parse_record(PAGE_VIEW, r.key, r.value)[1] is None for r in views)
    profiles = seedgen.member_profiles("p", members, START, updates=3, deletes=1)
    assert sum(r.value is None for r in profiles) == 1
    assert all(parse_record(PROFILE, r.key, r.value)[1] is None for r in profiles if r.value is not None)
    settings = seedgen.member_settings("s", members, START, updates=2)
    assert all(parse_record(SETTINGS, r.key, r.value)[1] is None for r in settings)
    imps, clicks = seedgen.ad_events("i", "c", members, 40, START, late_rate=0.2)
    assert all(parse_record(AD_IMPRESSION, r.key, r.value)[1] is None for r in imps)
    assert all(parse_record(AD_CLICK, r.key, r.value)[1] is None for r in clicks)
    shown = {r.key: r.timestamp_ms for r in imps}
    delays = [timedelta(milliseconds=r.timestamp_ms - shown[r.key]) for r in clicks]
    assert any(d > timedelta(minutes=10) for d in delays) and any(d <= timedelta(minutes=10) for d in delays)
    merged = seedgen.by_time(imps, clicks)
    assert [r.timestamp_ms for r in merged] == sorted(r.timestamp_ms for r in merged)
