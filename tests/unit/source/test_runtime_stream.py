"""What kappa's runtime gives Spark's Kafka source (`jobs.lib.runtime.stream`) and how a backfill's read
progress is derived from the checkpoint (`jobs.lib.runtime.backfill`): no Spark, no broker."""

from __future__ import annotations

import json

import pytest

from jobs.lib.contract.runner import kappa_options
from jobs.lib.runtime.backfill import BackfillProgress, clear_when_committed, initial_offsets
from jobs.lib.runtime.stream import java_kafka_config, kafka_options, needs_backfill
from jobs.lib.source.read_progress import progress_positions, read_progress
from orchestrator.core.exceptions import ConfigError


def test_librdkafka_sasl_settings_become_a_jaas_config_for_the_java_client():
    out = java_kafka_config({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-512",
                             "sasl.username": "kappa", "sasl.password": 'p"w\\d', "group.id": "ignored"})
    assert out == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                   "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                       'username="kappa" password="p\\"w\\\\d";'}
    plain = java_kafka_config({"sasl.username": "u", "sasl.password": "p"})
    assert plain["sasl.mechanism"] == "PLAIN" and "PlainLoginModule" in plain["sasl.jaas.config"]
    with pytest.raises(ConfigError, match=r"sasl.mechanism 'GSSAPI' with sasl.username/sasl.password"):
        java_kafka_config({"sasl.mechanism": "GSSAPI", "sasl.username": "u", "sasl.password": "p"})


def test_kafka_options_for_a_version_and_overrides_by_either_case():
    opts = kafka_options("127.0.0.1:9092", "a,b", kafka_config={"security.protocol": "SSL"},
                         max_offsets_per_trigger=500, min_partitions=2,
                         overrides={"STARTINGOFFSETS": "latest", "kafka.fetch.max.bytes": 1024})
    assert opts == {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "a,b",
                    "kafka.isolation.level": "read_committed", "failOnDataLoss": "false",
                    "fetchOffset.numRetries": "3", "fetchOffset.retryIntervalMs": "1000",
                    "kafka.default.api.timeout.ms": "40000", "kafka.request.timeout.ms": "30000",
                    "kafkaConsumer.pollTimeoutMs": "120000", "maxOffsetsPerTrigger": "500",
                    "minPartitions": "2", "kafka.max.poll.records": "10000",
                    "kafka.max.partition.fetch.bytes": "4194304", "kafka.receive.buffer.bytes": "1048576",
                    "kafka.security.protocol": "SSL", "STARTINGOFFSETS": "latest", "kafka.fetch.max.bytes": "1024"}
    # kappa's own: the outage time sets the client's timeouts; failOnDataLoss is kappa's check, never Spark's
    short = kafka_options("b:1", "a", overrides={"brokerOutageSeconds": 9, "failOnDataLoss": "true"})
    assert (short["kafkaConsumer.pollTimeoutMs"], short["kafka.default.api.timeout.ms"]) == ("9000", "3000")
    assert short["failOnDataLoss"] == "false" and "brokerOutageSeconds" not in short
    with pytest.raises(ConfigError, match=r"^source_options: brokerOutageSeconds must be a number of seconds above 0"):
        kafka_options("b:1", "a", overrides={"brokerOutageSeconds": "soon"})
    with pytest.raises(ConfigError, match=r"^source_options: failOnDataLoss must be true or false, got 'maybe'$"):
        kafka_options("b:1", "a", overrides={"failOnDataLoss": "maybe"})
    with pytest.raises(ConfigError, match=r"^source_options: unknown option 'readTimeoutSeconds' of Spark's Kafka "
                                          r"source; known: subscribe, .*, brokerOutageSeconds \(kappa's\) and kafka\.\* client settings$"):
        kafka_options("127.0.0.1:9092", "a", overrides={"readTimeoutSeconds": 5})


def test_the_consumer_polls_many_records_and_a_version_s_settings_override_kappa_s():
    """Spark's source asks a partition's log start and end after every poll: kappa's polls are 20 times the
    client's default of 500 records (`CONSUMER_SETTINGS`); a pipeline's source_options win, in either case."""
    opts = kafka_options("b:1", "a")
    assert (opts["kafka.max.poll.records"], opts["kafka.max.partition.fetch.bytes"],
            opts["kafka.receive.buffer.bytes"]) == ("10000", str(4 << 20), str(1 << 20))
    over = kafka_options("b:1", "a", overrides={"KAFKA.MAX.POLL.RECORDS": 50, "kafka.receive.buffer.bytes": -1})
    assert over["KAFKA.MAX.POLL.RECORDS"] == "50" and "kafka.max.poll.records" not in over
    assert over["kafka.receive.buffer.bytes"] == "-1"


def test_a_version_that_goes_on_past_lost_records_reads_each_partition_in_one_task():
    # Spark's source reuses a consumer it gave back when it skips lost offsets; two tasks of one partition
    # may then poll it at once (tests/integration/standardize/test_standardize_kafka.py shows it fail)
    assert kafka_options("b:1", "a", min_partitions=8)["minPartitions"] == "8"
    assert kafka_options("b:1", "a", min_partitions=8, overrides={"failOnDataLoss": "true"})["minPartitions"] == "8"
    assert "minPartitions" not in kafka_options("b:1", "a", min_partitions=8, overrides={"failOnDataLoss": "false"})
    for option in ("minPartitions", "MAXRECORDSPERPARTITION"):
        with pytest.raises(ConfigError, match=rf"^source_options: {option} with failOnDataLoss = false: Spark's Kafka "
                                              rf"source splits .* ConcurrentModificationException\); drop {option}, "
                                              rf"or keep failOnDataLoss = true$"):
            kafka_options("b:1", "a", overrides={"failOnDataLoss": "false", option: 4})
        assert kafka_options("b:1", "a", overrides={option: 4})[option] == "4"
    with pytest.raises(ConfigError, match=r"^source_options: minPartitions with failOnDataLoss = false"):
        kappa_options({"source_options": {"failOnDataLoss": "false", "minPartitions": 4}})


def test_a_backfill_is_due_until_the_checkpoint_has_a_commit(tmp_path):
    assert needs_backfill(tmp_path / "none")
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / ".0.crc").write_text("")
    assert needs_backfill(tmp_path)
    (tmp_path / "commits" / "0").write_text("v1\n{}\n")
    assert not needs_backfill(tmp_path)


def _checkpoint(tmp_path, start, end):
    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "sources" / "0" / "0").write_text("\x00v1\n" + json.dumps(start))
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1\n{}\n" + json.dumps(end) + "\n")
    return tmp_path


class _Stage:
    def __init__(self, done, total):
        self.numCompletedTasks, self.numTasks = done, total


class _Tracker:
    """Spark's status tracker as the watcher reads it: one job of the group, stages 7 (the scan) and 8."""

    def __init__(self):
        self.done = 0

    def getJobIdsForGroup(self, group):
        return [3] if group == "g" else []

    def getJobInfo(self, job):
        return type("J", (), {"stageIds": [8, 7]})()

    def getStageInfo(self, stage):
        return _Stage(self.done, 4) if stage == 7 else _Stage(0, 2)


def test_the_backfill_reads_as_far_as_its_scan_tasks_finished(tmp_path):
    end = {"t": {"0": 1000, "1": 400}}
    ckpt = _checkpoint(tmp_path, {"t": {"0": 200, "1": 0}}, end)
    assert initial_offsets(ckpt) == {("t", 0): 200, ("t", 1): 0}
    tracker = _Tracker()
    spark = type("S", (), {"sparkContext": type("C", (), {"statusTracker": lambda self: tracker})()})()
    with BackfillProgress(spark, str(ckpt), "g", end) as progress:
        assert progress.share_done() == 0.0
        tracker.done = 2
        progress.report(progress.share_done(), final=True)
        (batch,) = read_progress(ckpt)
        positions = progress_positions([batch])
        assert {tp: p.next_offset for tp, p in positions.items()} == {("t", 0): 600, ("t", 1): 200}
        assert sum(p.unread for p in positions.values()) == 400 + 200
        progress.read()
        assert sum(p.unread for p in progress_positions(read_progress(ckpt)).values()) == 0
    clear_when_committed(ckpt)                       # not committed yet: kept
    assert read_progress(ckpt)
    (ckpt / "commits").mkdir()
    (ckpt / "commits" / "0").write_text("v1\n{}\n")
    clear_when_committed(ckpt)
    assert read_progress(ckpt) == []
