"""The seed jobs' shared plumbing without Spark: their own options and topic roles, kappa's options
(`jobs.lib.contract.runner.kappa_options`), the state partitions of a query's start, and the seed generators'
output. The micro-batch writer runs in Spark:
tests/integration/seedjobs/test_seedjob_batches.py."""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta, timezone

import pytest

from jobs.lib.source.events import AD_CLICK, AD_IMPRESSION, PAGE_VIEW, PROFILE, SETTINGS, parse_record
import jobs.lib.runtime.seedjob
from jobs.lib.contract.runner import kappa_options
from jobs.lib.runtime.seedjob import duration_options, start_query, state_partitions, topic_roles
from orchestrator.dev import seedgen
from orchestrator.core.exceptions import ConfigError

START = datetime(2024, 5, 1, 8, 0, tzinfo=timezone.utc)


def ctx(topics: str, extra: dict | None = None):
    return argparse.Namespace(args=argparse.Namespace(topics_list=topics.split(",")), extra=extra or {})


def job(topics: str, extra: dict | None = None):
    """What a job's function sees of its topics and options (`jobs.lib.contract.api.JobInput`)."""
    return argparse.Namespace(topics=tuple(topics.split(",")), options=kappa_options(extra))


def test_topic_roles_and_options_say_what_is_expected():
    assert topic_roles(job("a,b"), ("x", "y"), "j") == ["a", "b"]
    with pytest.raises(ConfigError) as e:
        topic_roles(job("a"), ("ad impressions", "ad clicks"), "ad_click_join")
    assert str(e.value) == (
        "job ad_click_join reads 2 topic(s) in this order: ad impressions, ad clicks; the pipeline has 'a': "
        "set topics = [<ad impressions>, <ad clicks>] in the pipelines file")
    options = duration_options(job("a", {"watermark": " 3 hours", "source_options": {"failOnDataLoss": "false"}}),
                               {"window": "1 hour", "watermark": "2 hours"}, "j")
    assert options == {"window": "1 hour", "watermark": "3 hours"}
    with pytest.raises(ConfigError, match=r"job j has no option 'wm'; its options: watermark \(and kappa's: "):
        duration_options(job("a", {"wm": "1 hour"}), {"watermark": "2 hours"}, "j")
    with pytest.raises(ConfigError, match=r"must be a duration such as \"10 minutes\""):
        duration_options(job("a", {"watermark": "1 hour; DROP"}), {"watermark": "2 hours"}, "j")


def test_state_partitions_is_a_pipeline_option_applied_when_the_query_starts(monkeypatch):
    """`[pipelines.X.options] state_partitions = 4` reaches the job as --extra; the query starts
    with that many shuffle (state) partitions, and the shared session keeps its own number."""
    assert state_partitions(ctx("a"), "j") is None
    assert state_partitions(ctx("a", {"state_partitions": 4}), "j") == 4
    assert duration_options(job("a", {"state_partitions": "6", "watermark": "3 hours"}),
                            {"watermark": "2 hours"}, "j") == {"watermark": "3 hours"}
    for bad in (0, -1, "two", 1.5, True):
        with pytest.raises(ConfigError, match=r"option 'state_partitions' must be a positive integer \(the "
                                              r"pipeline's options.state_partitions\), got"):
            kappa_options({"state_partitions": bad})

    class Conf(dict):       # Spark's RuntimeConfig: get(key, default), set, unset
        def get(self, k, default=None):
            return dict.get(self, k, default)

        def set(self, k, v):
            self[k] = v

        def unset(self, k):
            self.pop(k, None)

    conf = Conf({"spark.sql.shuffle.partitions": "2"})
    # the query starts with the session's setting as it is at start_stream
    monkeypatch.setattr(jobs.lib.runtime.seedjob, "start_stream", lambda *a, **kw: conf["spark.sql.shuffle.partitions"])
    c = ctx("a", {"state_partitions": 5})
    c.spark = argparse.Namespace(conf=conf)
    c.args.pipeline, c.args.version, c.args.checkpoint = "p", 1, "/cp"
    c.trigger_kwargs = lambda: {"availableNow": True}
    c.kafka_options = lambda: {}
    writer = argparse.Namespace(timings=[])
    assert start_query(c, lambda read: read(), writer, output_mode="update", job="j") == "5"
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


@pytest.mark.parametrize("options, fragment", [
    ("often", "upkeep must be a table such as"),
    ({"optimise_every": 3}, "unknown upkeep option(s) 'optimise_every'; known: optimize_every, vacuum_retention_hours"),
    ({"optimize_every": -1}, "'optimize_every' must be a whole number of micro-batches >= 0"),
    ({"optimize_every": 2.5}, "'optimize_every' must be a whole number of micro-batches"),
    ({"vacuum_retention_hours": 0.5}, "'vacuum_retention_hours' must be a number of hours >= 1"),
])
def test_upkeep_options_are_checked_before_spark_starts(options, fragment):
    from jobs.lib.sink.upkeep import Upkeep

    with pytest.raises(ConfigError) as e:
        kappa_options({"upkeep": options})
    assert fragment in str(e.value) and "\n" not in str(e.value)
    up = Upkeep.from_options(["/t"], {"optimize_every": 0, "vacuum_retention_hours": 24})
    assert (up.optimize_every, up.retention_hours) == (0, 24.0)
