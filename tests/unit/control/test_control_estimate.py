"""The backfill estimate (issue 32): the log's size, the rate (measured on an earlier version, or a default),
the cores, stored at deploy; the actual kept once after the backfill; the two compared."""

from __future__ import annotations

import json

import pytest

from control_helpers import PIPELINE, TOPIC, allocate, fake_running
from orchestrator.airflow.estimates import backfill_md, form_estimates, form_label, start_note
from orchestrator.cli.status import backfill_fields
from orchestrator.core.settings import Settings
from orchestrator.lifecycle import deploy as deploy_mod
from orchestrator.lifecycle.await_ready import readiness
from orchestrator.lifecycle.deploy import deploy
from orchestrator.observe.estimate import (DEFAULT_RATES, DEFAULT_STARTUP_SECONDS, BackfillEstimate, compare,
                                           compare_text, cores_of, estimate_backfill, parse_log_dirs)

#: v1's measured backfill: 150 offsets read in 3 s, 5 s after its job started, on 2 cores.
MEASURED = {"batch_id": 0, "records": 140, "offsets": 150, "batch_seconds": 3.0, "seconds": 5.0, "cores": 2,
            "bytes": 30_000, "end_offsets": {TOPIC: {"0": 100, "1": 50}}}


@pytest.fixture
def policies(monkeypatch):
    monkeypatch.setattr(deploy_mod, "_topic_policies", lambda k, topics: {t: ("compact", False) for t in topics})


def test_without_history_the_log_size_and_a_default_rate_said_so(k, spec, fake_log):
    est = estimate_backfill(k, spec)
    assert (est.known, est.records, est.bytes, est.bytes_source, est.cores) == (True, 150, 30_000, "log-dirs", 2)
    assert [(t.topic, t.partitions, t.records, t.bytes) for t in est.topics] == [(TOPIC, 2, 150, 30_000)]
    assert est.rate == DEFAULT_RATES["standardize"] * 2 and est.startup_seconds == DEFAULT_STARTUP_SECONDS
    assert est.rate_source == "default for standardize (25,000 records/s a core), no earlier version measured"
    assert est.seconds == pytest.approx(DEFAULT_STARTUP_SECONDS + 150 / 50_000)
    assert est.from_version is None
    assert "an upper bound on a compacted topic" in est.summary()
    assert est.lines()[1:] == [f"  topic {TOPIC}: 2 partitions, 150 records, 30.0 KB",
                               "  bytes: the partitions' segment sizes"]


def test_the_rate_comes_from_the_newest_measured_version_scaled_to_the_cores(k, spec, fake_log):
    allocate(k, backfill={**MEASURED, "batch_seconds": 30.0})     # v1: older, slower
    allocate(k, backfill=MEASURED)                                 # v2: the newest measured
    allocate(k)                                                    # v3: not measured (still backfilling)
    est = estimate_backfill(k, spec)
    assert (est.from_version, est.rate, est.startup_seconds) == (2, 50.0, 2.0)
    assert est.seconds == pytest.approx(2.0 + 150 / 50.0)         # start-up + records / rate: 5 s, as measured
    assert est.rate_source == "measured on v2's backfill: 150 records in 3.0 s"

    fake_log.ends[(TOPIC, 0)] = 1_000                                 # the log grew past twice the measured one
    assert estimate_backfill(k, spec).rate_source.endswith("; extrapolated to a log 7.0x that size")
    fake_log.ends[(TOPIC, 0)] = 100
    four = type(k)(k.settings.model_copy(update={"spark_master": "local[4]"}), registry=k.registry,
                   pipelines=k.pipelines)
    scaled = estimate_backfill(four, spec)
    assert scaled.rate == 100.0 and scaled.rate_source.endswith("scaled from 2 to 4 free cores")


def test_a_broker_that_cannot_answer_makes_it_unknown_with_the_reason(k, spec, fake_log):
    fake_log.down = True
    est = estimate_backfill(k, spec)
    assert not est.known and est.seconds is None
    assert est.summary() == ("estimate unknown: cannot read log end offsets from the Kafka broker at 127.0.0.1:9 "
                             "(KafkaError{code=_TRANSPORT})")
    assert form_label(PIPELINE, est).endswith("backfill estimate unknown (cannot read log end offsets from the "
                                              "Kafka broker at 127.0.0.1:9 (KafkaError{code=_TRANSPORT}))")


def test_bytes_fall_back_to_a_sample_labelled_as_sampled(k, spec, fake_log, monkeypatch):
    from orchestrator.core.exceptions import BrokerError
    from orchestrator.observe import estimate as estimate_mod

    def no_tool(k, topics, timeout=30.0):
        raise BrokerError("Kafka's LogDirsCommand failed: boom")

    monkeypatch.setattr(estimate_mod, "log_dir_bytes", no_tool)
    monkeypatch.setattr(estimate_mod, "sampled_bytes", lambda k, logs, timeout=5.0: {TOPIC: 150 * 180})
    est = estimate_backfill(k, spec)
    assert (est.bytes, est.bytes_source) == (27_000, "sampled")
    assert "(sampled)" in est.summary()
    assert est.bytes_note == ("records x the average size of 5 records sampled per partition "
                              "(LogDirsCommand: Kafka's LogDirsCommand failed: boom)")


def test_deploy_stores_the_estimate_with_the_version_and_the_dry_run_shows_it(k, spec, fake_log, fake_jobs,
                                                                                policies):
    preview = deploy(k, spec, actor="alice", reason="r", dry_run=True)
    assert preview.estimate is not None and preview.estimate.records == 150
    info = deploy(k, spec, actor="alice", reason="r", start=False)
    stored = k.registry.get_version(PIPELINE, info.version).details["estimate"]
    assert stored["records"] == 150 and stored["known"] is True
    assert info.estimate == BackfillEstimate.model_validate(stored)


def test_a_broker_down_leaves_the_deploy_as_it_was_with_an_unknown_estimate(k, spec, fake_log, fake_jobs, policies):
    fake_log.down = True
    info = deploy(k, spec, actor="alice", reason="r", start=False)
    assert info.version == 1 and not info.estimate.known
    assert "cannot read log end offsets" in k.registry.get_version(PIPELINE, 1).details["estimate"]["reason"]


def test_readiness_keeps_the_measured_backfill_once(k, spec, fake_log):
    n = allocate(k, estimate={"known": True, "seconds": 4.0, "bytes": 30_000, "rate_source": "default"}).version
    k.registry.set_state(PIPELINE, n, "backfilling")
    fake_running(k, n, backfill=None)
    readiness(k.version(PIPELINE, n), record=True)
    assert "backfill" not in k.registry.get_version(PIPELINE, n).details     # not written yet: nothing kept

    started = json.loads(k.paths(PIPELINE, n).launch_file.read_text())["started_at"]
    measure = {"batch_id": 0, "records": 140, "offsets": 150, "seconds": 3.0, "committed_at": started + 5.0,
               "end_offsets": {TOPIC: {"0": 100, "1": 50}}}
    fake_running(k, n, backfill=measure)
    fake_log.read_all()
    readiness(k.version(PIPELINE, n), record=True)
    kept = k.registry.get_version(PIPELINE, n).details["backfill"]
    assert kept == {"batch_id": 0, "records": 140, "offsets": 150, "bytes": 30_000, "batch_seconds": 3.0,
                    "seconds": pytest.approx(5.0, abs=0.01), "committed_at": started + 5.0,
                    "end_offsets": {TOPIC: {"0": 100, "1": 50}}, "cores": 2, "busy_cores": None}

    fake_running(k, n, backfill={**measure, "seconds": 99.0})    # a later run of the job: the first one stands
    readiness(k.version(PIPELINE, n), record=True)
    assert k.registry.get_version(PIPELINE, n).details["backfill"]["batch_seconds"] == 3.0
    assert k.registry.set_detail_once(PIPELINE, n, "backfill", {"seconds": 1}) is False


@pytest.mark.parametrize(("actual", "ratio", "within"), [(10.0, 1.0, True), (12.5, 1.25, True), (7.5, 0.75, True),
                                                         (12.6, 1.26, False), (5.0, 0.5, False)])
def test_estimate_beside_actual_within_a_quarter(actual, ratio, within):
    c = compare({"known": True, "seconds": 10.0, "rate_source": "measured on v1's backfill"}, {"seconds": actual})
    assert (c["ratio"], c["within_goal"]) == (ratio, within)


def test_the_lines_that_show_estimate_and_actual():
    est = {"known": True, "seconds": 40.0, "rate_source": "measured on v1's backfill: 2,000,000 records in 30.0 s"}
    both = {"estimate": est, "backfill": {"seconds": 44.0}}
    assert compare_text(both) == ("backfill: estimate 40 s, actual 44 s (1.10 of the estimate, within 25%; measured "
                                  "on v1's backfill: 2,000,000 records in 30.0 s)")
    assert compare_text({"estimate": est}) == ("backfill: estimate 40 s (measured on v1's backfill: 2,000,000 "
                                               "records in 30.0 s)")
    assert compare_text({"estimate": {"known": False, "reason": "no broker"}}) == "backfill: estimate unknown (no broker)"
    assert compare_text({}) is None and compare({"known": False}, {"seconds": 1}) is None
    row = backfill_fields(both)
    assert row["estimate_vs_actual"]["ratio"] == 1.1 and row["backfill_text"] == compare_text(both)
    assert backfill_md(both) == ["Backfill: estimate 40 s, actual 44 s (1.10 of the estimate, within 25%; measured "
                                 "on v1's backfill: 2,000,000 records in 30.0 s).", ""]
    assert start_note(PIPELINE, 3, None) == (f"{PIPELINE} v3 started: backfilling from offset zero", [])


def test_cores_from_the_spark_master(tmp_path):
    def cores(master):
        return cores_of(Settings(home=tmp_path, spark_master=master))

    assert cores("local[4]") == (4, "spark_master local[4]")
    assert cores("local")[0] == 1 and cores("local[*]")[0] >= 1
    assert cores("spark://127.0.0.1:7077") == (None, "spark_master spark://127.0.0.1:7077: the cluster's cores are "
                                                     "not known to kappa")


def test_log_dirs_take_each_partitions_largest_replica_and_skip_future_ones():
    doc = {"brokers": [
        {"broker": 1, "logDirs": [{"logDir": "/a", "error": None, "partitions": [
            {"partition": "orders-0", "size": 100, "isFuture": False},
            {"partition": "orders-1", "size": 40, "isFuture": False},
            {"partition": "orders-1", "size": 999, "isFuture": True},
            {"partition": "other-0", "size": 7, "isFuture": False}]}]},
        {"broker": 2, "logDirs": [{"logDir": "/b", "error": None, "partitions": [
            {"partition": "orders-0", "size": 90, "isFuture": False},
            {"partition": "my-topic-2", "size": 5, "isFuture": False}]}]}]}
    assert parse_log_dirs(doc, ["orders", "my-topic"]) == {"orders": 140, "my-topic": 5}


def test_the_form_says_unknown_at_once_for_every_pipeline_once_the_broker_did_not_answer(tmp_path, spec, fake_log,
                                                                                           monkeypatch):
    from orchestrator.observe import lag as lag_mod

    asked = []
    real = lag_mod.log_offsets

    def counted(k, topics, timeout=10.0):
        asked.append(timeout)
        return real(k, topics, timeout)

    monkeypatch.setattr(lag_mod, "log_offsets", counted)
    fake_log.down = True
    other = spec.model_copy(update={"name": "other"})
    settings = Settings(home=tmp_path / "form", bootstrap_servers="127.0.0.1:9")
    labels = form_estimates(settings, {PIPELINE: spec, "other": other})
    assert len(asked) == 1 and asked[0] <= 3.0               # one bounded ask, not one per pipeline
    assert labels["other"] == labels[PIPELINE].replace(PIPELINE, "other", 1)
    assert "backfill estimate unknown (cannot read log end offsets" in labels["other"]
    assert not (tmp_path / "form" / "registry.db").exists()  # the form creates no registry

    fake_log.down = False
    labels = form_estimates(settings, {PIPELINE: spec})
    assert labels[PIPELINE] == (f"{PIPELINE}: backfill ~8 s (150 records at most, 2 cores; default rate, no earlier "
                                f"version measured)")


def test_a_rate_is_scaled_to_the_cores_left_free_by_the_running_jobs(k, spec, fake_log, monkeypatch):
    """The serving version's live micro-batches take their cores first: v2 measured alone on 2 free cores
    (50 records/s), a deploy beside a job busy with 1 core gets half that; a rate measured beside a busy job
    is scaled up to a machine with nothing else running."""
    from orchestrator.observe import estimate as estimate_mod

    allocate(k, backfill=MEASURED)                                            # v1: measured, nothing busy
    monkeypatch.setattr(estimate_mod, "running_cores", lambda recs: (1.0, "1.0 busy with the job of v1"))
    est = estimate_backfill(k, spec, busy=True)
    assert (est.busy_cores, est.rate) == (1.0, 25.0)
    assert est.rate_source.endswith("scaled from 2 to 1 free cores")
    assert "2 cores (1.0 free: 1.0 busy with the job of v1)" in est.summary()
    assert estimate_backfill(k, spec).busy_cores is None                     # not sampled unless asked

    allocate(k, backfill={**MEASURED, "busy_cores": 1.5})                     # v2: measured beside a busy job
    monkeypatch.setattr(estimate_mod, "running_cores", lambda recs: (None, None))
    # a job busy with 1.5 of 2 cores still leaves the backfill half of them (equal shares): 1 free then, 2 now
    assert estimate_backfill(k, spec, busy=True).rate == pytest.approx(50.0 * 2 / 1.0)


def test_the_actual_keeps_the_busy_cores_its_estimate_saw():
    from orchestrator.observe.estimate import backfill_actual

    actual = backfill_actual({"batch_id": 0, "records": 10, "offsets": 10, "seconds": 2.0, "committed_at": 12.0},
                             started_at=7.0, cores=2, estimate={"bytes": 2_000, "busy_cores": 0.9})
    assert (actual["busy_cores"], actual["cores"], actual["seconds"], actual["batch_seconds"]) == (0.9, 2, 5.0, 2.0)

