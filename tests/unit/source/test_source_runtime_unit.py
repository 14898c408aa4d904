"""The job runtime's pieces that need no Spark: arguments, status file, batch accounting, errors."""

from __future__ import annotations

import json

import pytest

from jobs.lib.runtime.args import parse_args
from jobs.lib.runtime.context import JobContext
from jobs.lib.runtime.status import Status, read_status, summarize_error
from orchestrator.core.files import write_json_atomic
from orchestrator.core.exceptions import SourceError
from tests.waiting import wait_until

ARGS = ["--pipeline", "standardize", "--version", "3", "--bootstrap-servers", "127.0.0.1:9092",
        "--topics", "a, b", "--output", "/w/standardize/v3", "--checkpoint", "/s/cp", "--run-dir", "/s/run"]


def test_arguments_and_their_defaults():
    a = parse_args(ARGS)
    assert a.topics_list == ["a", "b"] and a.version == 3
    assert a.group_id == "kappa.standardize.v3"
    assert a.rejects == "/w/standardize/v3__rejects"
    assert a.trigger == "continuous" and a.interval_seconds == 1.0 and a.max_records_per_batch == 100_000
    a = parse_args(ARGS + ["--trigger", "available-now", "--kafka-config", '{"security.protocol": "SSL"}',
                           "--extra", '{"source_options": {"on.missing.offsets": "earliest"}}'])
    assert a.kafka_config == {"security.protocol": "SSL"}


@pytest.mark.parametrize("extra, fragment", [
    (["--kafka-config", "[1]"], "--kafka-config must be a JSON object"),
    (["--trigger", "sometimes"], "invalid choice"),
    (["--max-records-per-batch", "0"], "must be positive"),
])
def test_bad_arguments_are_refused(capsys, extra, fragment):
    with pytest.raises(SystemExit) as e:
        parse_args(ARGS + extra)
    assert e.value.code == 2
    assert fragment in capsys.readouterr().err


def _ctx(tmp_path, *more):
    args = parse_args(ARGS + ["--run-dir", str(tmp_path)] + list(more))
    status = Status(tmp_path / "status.json", args.pipeline, args.version, args.trigger)
    return JobContext(args, spark=None, status=status)


def test_kafka_options_and_trigger(tmp_path):
    ctx = _ctx(tmp_path, "--kafka-config", '{"security.protocol": "SSL"}', "--max-records-per-batch", "500",
               "--extra", '{"source_options": {"minPartitions": 8}}', "--interval-seconds", "0.5")
    opts = ctx.kafka_options()
    assert {k: opts[k] for k in ("kafka.bootstrap.servers", "subscribe", "startingOffsets", "maxOffsetsPerTrigger",
                                 "kafka.security.protocol", "minPartitions")} == {
        "kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "a,b", "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "500", "kafka.security.protocol": "SSL", "minPartitions": "8"}
    assert ctx.kafka_options(["b"])["subscribe"] == "b"
    assert ctx.trigger_kwargs() == {"processingTime": "500 milliseconds"}
    assert _ctx(tmp_path, "--trigger", "available-now").trigger_kwargs() == {"availableNow": True}


def _progress(batch_id, rows, end):
    return {"id": "q", "batchId": batch_id, "numInputRows": rows,
            "durationMs": {"addBatch": 5, "triggerExecution": 9},
            "sources": [{"endOffset": json.dumps(end)}]}


@pytest.fixture
def group_commits(monkeypatch):
    """The consumer-group commits the runtime makes, recorded instead of sent to a broker. A commit
    waits while `gate` is clear, so a test can hold one in flight."""
    import threading

    import jobs.lib.source.consumer_groups as consumer_groups

    calls, gate = [], threading.Event()
    gate.set()

    def commit(bootstrap, group_id, offsets, kafka_config=None, timeout=30.0):
        calls.append((group_id, offsets))
        gate.wait(60)

    monkeypatch.setattr(consumer_groups, "commit_group_offsets", commit)
    return calls, gate


def _commit_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == "kappa-group-commit"]


def test_batch_accounting_from_listener_and_job(tmp_path, group_commits):
    ctx = _ctx(tmp_path)
    ctx.status.update(state="running")
    ctx.record_batch(0, rows_in=10, rows_out=8, rejects=2, rejects_total=2)
    ctx.on_progress(_progress(0, 10, {"a": {"0": 10}}))
    ctx.on_progress(_progress(0, 10, {"a": {"0": 10}}))          # duplicates are ignored
    ctx.on_progress(_progress(1, 5, {"a": {"0": 15}}))           # a batch the job did not report
    ctx.on_progress({"id": "q", "batchId": 2, "numInputRows": 0,  # an idle trigger, not a batch
                      "durationMs": {"latestOffset": 3, "triggerExecution": 3}, "sources": []})
    ctx.record_batch(0, rows_in=10, rows_out=9, rejects=1)         # re-reported: replaces
    s = read_status(tmp_path)
    assert s["state"] == "running" and s["pipeline"] == "standardize" and s["version"] == 3
    assert s["batch_id"] == 1 and s["batches"] == 2
    assert (s["rows_in"], s["rows_out"], s["rejects"], s["rejects_total"]) == (15, 9, 1, 2)
    assert s["end_offsets"] == {"a": {"0": 15}}
    ctx.rules_hash = "abc"
    assert read_status(tmp_path)["rules_hash"] == "abc"
    wait_until(lambda: not _commit_threads(), "the group commits to end", 30)
    assert group_commits[0] and group_commits[0][-1] == ("kappa.standardize.v3", {"a": {"0": 15}})


def test_the_last_batch_s_stage_times_and_spark_jobs_reach_the_status_and_kappa_status(tmp_path, group_commits):
    from orchestrator.cli.status import last_batch_line

    ctx = _ctx(tmp_path)
    assert read_status(tmp_path) is None or read_status(tmp_path)["last_batch"] is None
    ctx.record_batch(41, rows_in=20, rows_out=19, rejects=1, timing={
        "batch_id": 41, "read_transform_count": 0.9041, "rejects": 0.0, "write": 1.5, "upkeep": 0.01, "spark_jobs": 12})
    last = read_status(tmp_path)["last_batch"]
    assert last == {"batch_id": 41, "records": 20, "read_transform_count": 0.904, "rejects": 0.0, "write": 1.5,
                    "upkeep": 0.01, "spark_jobs": 12}
    row = {"version": 2, "job": {"pid": 123, "last_batch": last}}
    assert last_batch_line(row) == ("v2 last micro-batch 41: 20 records in 2.41 s, 12 Spark jobs (read and transform "
                                    "0.90 s, rejects 0.00 s, write 1.50 s, upkeep 0.01 s)")
    assert last_batch_line({"version": 2, "job": {"pid": None, "last_batch": last}}) is None   # not running


def test_the_backfill_batch_s_measure_reaches_the_status_once(tmp_path, group_commits):
    """The batch `jobs.lib.sink.batches` marks as the version's backfill becomes the status's `backfill`, which
    the orchestrator keeps as the measured backfill (`orchestrator.observe.estimate`); a later one does not replace it."""
    import time

    ctx = _ctx(tmp_path)
    before = time.time()
    ctx.record_batch(0, rows_in=140, rows_out=130, rejects=10, timing={
        "batch_id": 0, "read_transform_count": 2.0, "rejects": 0.5, "write": 0.5, "upkeep": 0.0, "spark_jobs": 4,
        "backfill": {"offsets": 150, "end_offsets": {"a": {"0": 150}}}})
    s = read_status(tmp_path)
    assert "backfill" not in s["last_batch"]
    b = s["backfill"]
    assert before <= b.pop("committed_at") <= time.time()
    assert b == {"batch_id": 0, "records": 140, "offsets": 150, "end_offsets": {"a": {"0": 150}}, "seconds": 3.0}
    ctx.record_batch(1, rows_in=5, rows_out=5, timing={"batch_id": 1, "read_transform_count": 0.1,
                                                       "backfill": {"offsets": 5, "end_offsets": {"a": {"0": 155}}}})
    assert read_status(tmp_path)["backfill"]["batch_id"] == 0


def test_batches_that_end_during_a_slow_group_commit_start_no_second_commit(tmp_path, group_commits):
    """With the broker down a commit waits for the coordinator until it gives up (45 s here: librdkafka
    waits a session timeout), and every batch meanwhile started one more thread, blocked behind it. Now one commit runs at a time
    and then commits the newest offsets."""
    calls, gate = group_commits
    gate.clear()                                                  # the first commit hangs
    ctx = _ctx(tmp_path)
    ctx.status.update(state="running")
    ctx.on_progress(_progress(0, 10, {"a": {"0": 10}}))
    wait_until(lambda: len(calls) == 1, "the first commit to start", 30)
    for b in range(1, 6):
        ctx.on_progress(_progress(b, 1, {"a": {"0": 10 + b}}))
    assert len(_commit_threads()) == 1 and len(calls) == 1
    gate.set()
    wait_until(lambda: not _commit_threads(), "the commit thread to end", 30)
    assert [offsets for _, offsets in calls] == [{"a": {"0": 10}}, {"a": {"0": 15}}]


def test_status_is_replaced_atomically(tmp_path):
    path = tmp_path / "status.json"
    write_json_atomic(path, {"state": "running"})
    write_json_atomic(path, {"state": "stopped"})
    assert json.loads(path.read_text()) == {"state": "stopped"}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]
    assert read_status(tmp_path / "nowhere") is None


def test_error_summary_finds_the_kappa_error_inside_a_spark_failure():
    class StreamingQueryException(Exception):
        pass

    spark_text = ("[STREAM_FAILED] Query [id = 1] terminated with exception: Job aborted.\n"
                  "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
                  '  File "/x/jobs/lib/source/checkpoint.py", line 1, in read\n'
                  "orchestrator.core.exceptions.SourceError: the broker no longer has offset 5 of topic t\n"
                  "\tat org.apache.spark.Foo.bar(Foo.scala:1)")
    assert summarize_error(StreamingQueryException(spark_text)) == \
        "SourceError: the broker no longer has offset 5 of topic t"
    assert summarize_error(SourceError("bad")) == "SourceError: bad"
    other = summarize_error(StreamingQueryException("boom\nRuntimeError: echo job told to fail at batch 1"))
    assert other == "RuntimeError: echo job told to fail at batch 1"
