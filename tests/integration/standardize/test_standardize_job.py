"""The standardize job against a real broker, Spark and Delta: output, rejects, metadata, rules errors."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from std_helpers import V1, V2, commits, read_sorted, run_in_process, run_job_process

from jobs.lib.rules.files import rules_path
from jobs.lib.runtime.status import read_status
from jobs.lib.source.checkpoint import checkpoint_offsets, last_committed_batch
from orchestrator.core.tables import count_rows, read_table
from tests.oracle.standardize import OUTPUT_SCHEMA

pytestmark = pytest.mark.integration


def category(reason: str) -> str:
    return reason.split(":")[0]


def test_job_process_output_equals_the_expected_table(bootstrap, changelog, paths, seed):
    code, log = run_job_process(paths.argv(bootstrap, changelog.topic, rules_path("titles", "v2")),
                                paths.run_dir / "job.log")
    assert code == 0, log[-3000:]
    expected = changelog.expected("v2")

    out = read_sorted(paths.output)
    assert out.schema.equals(OUTPUT_SCHEMA)
    assert out.num_rows == expected.table.num_rows
    assert out.equals(expected.table)
    assert pc.count_distinct(out["member_id"]).as_py() == out.num_rows
    assert any(not n.isascii() for n in out["name"].to_pylist())

    # rejects: every malformed record once, with partition, offset, the exact reason and the raw record
    rejects = read_table(paths.rejects).to_pylist()
    assert sorted((r["partition"], r["offset"], r["error"]) for r in rejects) == sorted(expected.rejects)
    raw = {(r.partition, r.offset): (r.key, r.value) for r in changelog.log}
    assert all((r["key"], r["value"]) == raw[r["partition"], r["offset"]] for r in rejects)
    assert {r["topic"] for r in rejects} == {changelog.topic}
    assert Counter(category(r["error"]) for r in rejects).keys() >= {
        "invalid JSON", "not a JSON object", "name", "title"}
    assert any(r["error"].endswith(": given twice") for r in rejects)

    status = read_status(paths.run_dir)
    assert status["state"] == "finished" and status["error"] is None
    assert status["rows_in"] == 4000
    assert status["rejects"] == status["rejects_total"] == len(expected.rejects) == count_rows(paths.rejects)
    assert status["rules_hash"] == V2.content_hash
    assert status["end_offsets"] == checkpoint_offsets(paths.checkpoint)

    # every output commit: app transaction and metadata; the last one carries the final end offsets
    last = last_committed_batch(paths.checkpoint)
    assert last == 0  # the whole backfill is one micro-batch, whatever maxOffsetsPerTrigger says
    history = commits(paths.output)
    assert [h["batch_id"] for h in history] == list(range(last + 1))
    assert {(h["pipeline"], h["pipeline_version"], h["rules_hash"]) for h in history} == {("standardize", "1", V2.content_hash)}
    assert history[-1]["end_offsets"] == checkpoint_offsets(paths.checkpoint) == {
        changelog.topic: {str(p): sum(1 for r in changelog.log if r.partition == p) for p in range(4)}}
    assert DeltaTable(str(paths.output)).transaction_version("kappa.standardize.v1") == last
    assert DeltaTable(str(paths.rejects)).transaction_version("kappa.standardize.v1") == last
    assert [h["batch_id"] for h in commits(paths.rejects)] == list(range(last + 1))

    # Kafka's own tools see the same lag as the checkpoint (after 300 more records)
    assert_consumer_group_lag_is_the_checkpoint_s(bootstrap, changelog, paths, seed)


def test_reprocess_with_new_rules_in_process(spark, bootstrap, changelog, paths, tmp_path):
    """v1 and v2 of the pipeline over the same log, in the shared session, through the job's own
    `start_query`: each equals its expected table, and v2 changes a visible share of titles."""
    tables = {}
    for name, rules in (("v1", V1), ("v2", V2)):
        args = paths.args(bootstrap, changelog.topic, rules.path)
        args.version = int(name[1:])
        args.output, args.rejects = str(tmp_path / name), str(tmp_path / f"{name}__rejects")
        args.checkpoint = str(tmp_path / f"{name}_checkpoint")
        writer = run_in_process(spark, bootstrap, changelog.topic, args, rules)
        tables[name] = read_sorted(args.output)
        expected = changelog.expected(name)
        assert tables[name].equals(expected.table)
        assert sorted((r["partition"], r["offset"], r["error"]) for r in read_table(args.rejects).to_pylist()) == sorted(
            expected.rejects)
        assert writer.skipped == []
        assert commits(args.output)[-1]["rules_hash"] == rules.content_hash
    v1, v2 = tables["v1"], tables["v2"]
    assert v1["member_id"].equals(v2["member_id"]) and v1["title_raw"].equals(v2["title_raw"])
    changed = pc.sum(pc.fill_null(pc.not_equal(v1["title"], v2["title"]), False)).as_py()
    assert changed / v1.num_rows > 0.15
    merged = Counter(t for t, r in zip(v2["title"].to_pylist(), v1["title"].to_pylist()) if t != r)
    assert merged.most_common(2)[0][0] in ("Senior Software Engineer", "Software Engineer")


def test_bad_rules_file_fails_before_anything_starts(bootstrap, paths, tmp_path):
    good_pattern, bad_pattern = r"^(sr|senior) (software|swe)\b", r"^(sr|senior (software|swe)\b"
    text = rules_path("titles", "v2").read_text(encoding="utf-8")
    assert text.count(good_pattern) == 1
    bad = tmp_path / "v9.toml"
    bad.write_text(text.replace(good_pattern, bad_pattern), encoding="utf-8")
    line = [i for i, ln in enumerate(text.splitlines(), 1) if ln == "[[titles.regex]]"][1]
    code, log = run_job_process(paths.argv(bootstrap, "no_topic", bad), paths.run_dir / "job.log", timeout=120)
    message = (f"RulesError: rules file {bad}: titles.regex[1] (line {line}): bad regex {bad_pattern!r}: "
               f"missing ), unterminated subpattern at position 1")
    assert code == 1
    assert f"job standardize v1 failed before starting: {message}" in log
    status = read_status(paths.run_dir)
    assert (status["state"], status["error"]) == ("failed", message)
    # nothing started, nothing written
    assert "SparkContext" not in log and "Spark" not in log
    assert not (paths.run_dir / "spark-local").exists()
    assert not paths.output.exists() and not paths.rejects.exists() and not paths.checkpoint.exists()
    assert not paths.output.parent.exists()


@pytest.mark.parametrize("extra, message", [
    ({"key_order": "offset"}, "ConfigError: --extra: key_order must be one of partition, timestamp, got 'offset'"),
    ({"backfill": "all"}, "ConfigError: --extra: backfill must be one of one-batch, capped, got 'all'"),
    ({"source_options": {"readTimeoutSeconds": 5}},
     "ConfigError: source_options: unknown option 'readTimeoutSeconds' of Spark's Kafka source; known: "),
    ({"source_options": {"failOnDataLoss": "false", "minPartitions": 8}},
     "ConfigError: source_options: minPartitions with failOnDataLoss = false: Spark's Kafka source splits "),
    ({"upkeep": {"optimize_every": -1}},
     "ConfigError: --extra: upkeep option 'optimize_every' must be a whole number of micro-batches >= 0"),
])
def test_bad_job_options_fail_before_anything_starts(paths, extra, message):
    argv = paths.argv("127.0.0.1:9", "no_topic", rules_path("titles", "v2"))
    code, log = run_job_process([*argv, "--extra", json.dumps(extra)], paths.run_dir / "job.log", timeout=120)
    assert code == 1 and f"job standardize v1 failed before starting: {message}" in log
    assert read_status(paths.run_dir)["error"].startswith(message)
    assert not paths.output.parent.exists() and not paths.checkpoint.exists()


def test_an_option_the_job_does_not_take_fails_it_before_anything_is_written(paths):
    """kappa's options are checked before Spark starts; the job's own are the job's to check, when
    kappa calls its function, before the query starts: nothing is written either way."""
    argv = paths.argv("127.0.0.1:9", "no_topic", rules_path("titles", "v2"))
    code, log = run_job_process([*argv, "--extra", json.dumps({"buckets": 32})], paths.run_dir / "job.log",
                                timeout=300)
    message = ("ConfigError: the standardize job takes no options of its own, got 'buckets'; kappa's are key_order, "
               "backfill, source_options, upkeep")
    assert code == 1, log[-3000:]
    assert read_status(paths.run_dir)["error"].startswith(message), read_status(paths.run_dir)
    assert not paths.output.parent.exists() and not paths.checkpoint.exists()


def assert_consumer_group_lag_is_the_checkpoint_s(bootstrap, changelog, paths, seed) -> None:
    """Spark's Kafka source never commits; the job's runtime commits each finished batch's end offsets
    to the version's consumer group, so Kafka's own ConsumerGroupCommand describes the same lag per
    partition as the checkpoint against the log end."""
    from confluent_kafka import Consumer, TopicPartition

    from orchestrator.dev.broker import kafka_tool
    from orchestrator.dev.datagen import generate_changelog, produce

    produce(bootstrap, changelog.topic, generate_changelog(300, 1000, seed=seed + 1, first_new=False))
    group = paths.args(bootstrap, changelog.topic, V2.path).group_id
    described = kafka_tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                           ["--bootstrap-server", bootstrap, "--describe", "--group", group])
    rows = [line.split() for line in described.splitlines() if line.startswith(f"{group} ")]
    tool = {int(r[2]): (int(r[3]), int(r[4]), int(r[5])) for r in rows if r[1] == changelog.topic}

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kappa-test-watermarks"})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(changelog.topic, p), timeout=10)[1] for p in range(4)}
    finally:
        consumer.close()
    checkpoint = {int(p): o for p, o in checkpoint_offsets(paths.checkpoint)[changelog.topic].items()}
    assert set(tool) == set(range(4)), described
    assert {p: (c, e, lag) for p, (c, e, lag) in tool.items()} == {
        p: (checkpoint[p], ends[p], ends[p] - checkpoint[p]) for p in range(4)}
    assert sum(lag for _c, _e, lag in tool.values()) == 300


def test_start_job_warms_the_kafka_client_while_the_job_s_function_runs(spark, bootstrap, unique, paths, monkeypatch):
    """Before it calls the job's function on the stream, `start_job` starts an admin client asking the end
    offsets of the version's topics (`KafkaWarmUp`), the query's first request, so that the query's first
    trigger finds the Kafka client warm: ~0.8 s of a fresh JVM's first batch before, ~0.1 s after."""
    from confluent_kafka import Consumer, TopicPartition

    from jobs import standardize
    from jobs.lib.contract import runner
    from jobs.lib.rules.files import load_rules
    from jobs.lib.runtime.args import parse_args
    from jobs.lib.runtime.context import JobContext
    from jobs.lib.runtime.status import Status
    from jobs.lib.runtime.stream import KafkaWarmUp
    from orchestrator.dev import datagen

    topic = f"warm_{unique}"
    datagen.ensure_topic(bootstrap, topic, 2)
    datagen.produce(bootstrap, topic, datagen.generate_changelog(50, 20, seed=7), partitions=2)
    args = parse_args(paths.argv(bootstrap, topic, rules_path("titles", "v1")))
    started: list[KafkaWarmUp] = []
    seen_at_first_call: list[int] = []

    class Recorded(KafkaWarmUp):
        def start(self) -> None:
            started.append(self)
            super().start()

    def transform(job):
        if job.source.isStreaming:
            seen_at_first_call.append(len(started))
        return standardize.transform(job)
    monkeypatch.setattr(runner, "KafkaWarmUp", Recorded)
    ctx = JobContext(args, spark, Status(paths.run_dir / "status.json", args.pipeline, args.version, args.trigger))
    query = runner.start_job(ctx, standardize.JOB, transform, load_rules(args.rules))
    try:
        assert seen_at_first_call == [1], seen_at_first_call
        started[0].join(60)
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kappa-test-watermarks"})
        try:
            ends = {(topic, p): consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                    for p in range(2)}
        finally:
            consumer.close()
        assert started[0].error is None
        assert started[0].offsets == ends and sum(ends.values()) == 50, (started[0].offsets, ends)
    finally:
        query.stop()


def test_the_job_s_function_runs_once_on_the_stream_before_the_query_starts(spark, bootstrap, unique, paths):
    """`start_job` calls the job's function on the stream once, to learn its sink, and starts the query with
    that answer: it called it twice (once more in `start_query`), ~0.3 s of the query's start on a fresh JVM."""
    from jobs import standardize
    from jobs.lib.contract.runner import start_job
    from jobs.lib.rules.files import load_rules
    from jobs.lib.runtime.args import parse_args
    from jobs.lib.runtime.context import JobContext
    from jobs.lib.runtime.status import Status
    from orchestrator.dev import datagen

    topic = f"once_{unique}"
    datagen.ensure_topic(bootstrap, topic, 1)
    args = parse_args(paths.argv(bootstrap, topic, rules_path("titles", "v1")))
    on_stream = []

    def transform(job):
        if job.source.isStreaming:                   # the micro-batches' calls get a batch DataFrame
            on_stream.append(job.version)
        return standardize.transform(job)
    ctx = JobContext(args, spark, Status(paths.run_dir / "status.json", args.pipeline, args.version, args.trigger))
    query = start_job(ctx, standardize.JOB, transform, load_rules(args.rules))
    try:
        assert on_stream == [args.version], on_stream
    finally:
        query.stop()
