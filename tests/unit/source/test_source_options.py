"""The source's options under the names of Spark's Kafka connector, their old names, and the
backfill rule of `KafkaStreamReader.latestOffset` (no services: a simulated broker)."""

from __future__ import annotations

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from jobs.lib.kafka import KafkaStreamReader, SourceSettings, Watermarks
from jobs.lib.kafka.options import OPTION_NAMES, canonical_option
from orchestrator.core.exceptions import SourceError

SPARK_STYLE = {"kafka.bootstrap.servers": "h:1", "subscribe": "a,b", "startingOffsets": '{"a": {"0": 3}}',
               "maxOffsetsPerTrigger": "500", "failOnDataLoss": "false", "minPartitions": "4",
               "kafka.group.id": "g", "kafka.isolation.level": "read_uncommitted",
               "kafka.security.protocol": "SASL_SSL", "backfill": "capped", "splitMinRecords": "100",
               "readTimeoutSeconds": "5", "arrowBatchRows": "10"}
OLD_STYLE = {"bootstrap.servers": "h:1", "topics": "a,b", "starting.offsets": '{"a": {"0": 3}}',
             "max.records.per.batch": "500", "on.missing.offsets": "earliest", "min.partitions": "4",
             "group.id": "g", "isolation.level": "read_uncommitted", "kafka.security.protocol": "SASL_SSL",
             "backfill": "capped", "split.min.records": "100", "read.timeout.seconds": "5",
             "arrow.batch.rows": "10"}


def test_spark_connector_names_and_old_names_give_the_same_settings():
    new, old = SourceSettings.from_options(SPARK_STYLE), SourceSettings.from_options(OLD_STYLE)
    assert new == old
    assert new.topics == ("a", "b") and new.group_id == "g" and new.max_records_per_batch == 500
    assert new.on_missing_offsets == "earliest" and new.isolation_level == "read_uncommitted"
    assert (new.min_partitions, new.split_min_records, new.read_timeout_seconds, new.arrow_batch_rows) == (4, 100, 5.0, 10)
    assert new.starting_offsets == '{"a": {"0": 3}}' and new.backfill == "capped"
    assert new.kafka == (("security.protocol", "SASL_SSL"),)  # the named kafka.* options are not passed twice
    conf = new.consumer_config()
    assert conf["group.id"] == "g" and conf["isolation.level"] == "read_uncommitted"
    # Spark lower-cases option names (CaseInsensitiveDict); both spellings work
    assert SourceSettings.from_options({k.lower(): v for k, v in SPARK_STYLE.items()}) == new


def test_defaults_match_the_documented_ones():
    s = SourceSettings.from_options({"kafka.bootstrap.servers": "h:1", "subscribe": "t"})
    assert (s.on_missing_offsets, s.isolation_level, s.backfill, s.max_records_per_batch, s.starting_offsets) == (
        "fail", "read_committed", "one-batch", 100_000, "earliest")
    assert SourceSettings.from_options({"kafka.bootstrap.servers": "h:1", "subscribe": "t",
                                        "failOnDataLoss": "TRUE"}).on_missing_offsets == "fail"


def test_every_old_name_maps_to_its_primary_name():
    for primary, old in OPTION_NAMES.items():
        assert canonical_option(primary) == primary == canonical_option(primary.lower())
        if old:
            assert canonical_option(old) == primary
    assert canonical_option("kafka.sasl.mechanism") == "kafka.sasl.mechanism"


@pytest.mark.parametrize("opts, fragment", [
    ({"maxOffsetsPerTrigger": "5", "max.records.per.batch": "6"},
     r"max.records.per.batch='6' name the same option \(maxOffsetsPerTrigger\) with different values; give only maxOffsetsPerTrigger"),
    ({"failOnDataLoss": "true", "on.missing.offsets": "earliest"}, r"same option \(failOnDataLoss\)"),
    ({"kafka.group.id": "a", "group.id": "b"}, r"same option \(kafka.group.id\)"),
    ({"subscribePattern": "a.*"}, "subscribePattern of Spark's Kafka connector is not supported by kappa_kafka; "
                                  "accepted options: kafka.bootstrap.servers, subscribe, startingOffsets"),
    ({"assign": '{"t": [0]}'}, "assign of Spark's Kafka connector is not supported"),
    ({"maxOffsetPerTrigger": "5"}, r"unknown source option 'maxOffsetPerTrigger'; accepted options: .*maxOffsetsPerTrigger"),
    ({"failOnDataLoss": "sometimes"}, "failOnDataLoss must be true or false, got 'sometimes'"),
    ({"backfill": "twice"}, "backfill must be one of one-batch, capped, got 'twice'"),
    ({"on.missing.offsets": "latest"}, "on.missing.offsets must be one of fail, earliest"),
])
def test_option_errors_name_what_is_wrong(opts, fragment):
    with pytest.raises(SourceError, match=fragment):
        SourceSettings.from_options({"kafka.bootstrap.servers": "h:1", "subscribe": "t", **opts})


def test_both_names_with_the_same_value_are_fine():
    s = SourceSettings.from_options({"kafka.bootstrap.servers": "h:1", "bootstrap.servers": "h:1",
                                     "subscribe": "t", "failOnDataLoss": "false", "on.missing.offsets": "earliest"})
    assert s.bootstrap_servers == "h:1" and s.on_missing_offsets == "earliest"


# --- backfill: the first batch of a fresh query is not capped -----------------------------------

class FakeBroker:
    commit_failed = False

    def __init__(self, wms):
        self.wms = wms

    def partitions(self, required):
        return sorted(self.wms)

    def watermarks(self, tps, tolerate=False):
        return {tp: self.wms[tp] for tp in tps}

    def close(self):
        pass


SKEWED = {("t", 0): Watermarks(0, 900), ("t", 1): Watermarks(0, 30)}


def reader(cls=KafkaStreamReader, **opts):
    r = cls(SourceSettings.from_options({"kafka.bootstrap.servers": "h:1", "subscribe": "t",
                                         "maxOffsetsPerTrigger": "100", **opts}))
    r._broker = FakeBroker(dict(SKEWED))
    return r


def test_first_batch_of_a_fresh_query_reads_everything_then_batches_are_capped():
    r = reader()
    start = r.initialOffset()
    assert start == {"t": {"0": 0, "1": 0}}
    first = r.latestOffset(start, r.getDefaultReadLimit())
    assert first == {"t": {"0": 900, "1": 30}}
    r.broker.wms[("t", 0)] = Watermarks(0, 1500)  # the live tail: capped, shared equally
    assert r.latestOffset(first, r.getDefaultReadLimit()) == {"t": {"0": 1000, "1": 30}}


def test_backfill_stops_at_the_available_now_target():
    r = reader()
    r.prepareForTriggerAvailableNow()
    start = r.initialOffset()
    r.broker.wms[("t", 0)] = Watermarks(0, 5000)  # produced after the target was fixed
    first = r.latestOffset(start, ReadMaxRows(100))
    assert first == {"t": {"0": 900, "1": 30}}
    assert r.latestOffset(first, ReadMaxRows(100)) == first  # nothing beyond the target


def test_no_data_yet_keeps_the_backfill_for_the_first_real_batch():
    r = reader()
    r.broker.wms = {("t", 0): Watermarks(0, 0), ("t", 1): Watermarks(0, 0)}
    start = r.initialOffset()
    assert r.latestOffset(start, ReadMaxRows(100)) == start  # no batch: Spark asks again
    r.broker.wms = dict(SKEWED)
    assert r.latestOffset(start, ReadMaxRows(100)) == {"t": {"0": 900, "1": 30}}


def test_capped_backfill_and_restarted_queries_are_capped_from_the_first_batch():
    r = reader(backfill="capped")
    start = r.initialOffset()
    assert r.latestOffset(start, ReadMaxRows(100)) == {"t": {"0": 70, "1": 30}}
    restarted = reader()  # a checkpoint exists: Spark does not ask for initial offsets
    assert restarted.latestOffset({"t": {"0": 0, "1": 0}}, ReadMaxRows(100)) == {"t": {"0": 70, "1": 30}}
    assert restarted.latestOffset({"t": {"0": 0, "1": 0}}, ReadAllAvailable()) == {"t": {"0": 900, "1": 30}}


def test_a_subclass_that_overrides_only_the_data_path_inherits_the_backfill():
    class RangesReader(KafkaStreamReader):
        def schema(self):
            return "start bigint"

        def partitions(self, start, end):
            return []

        def read(self, partition):
            return iter(())

    r = reader(RangesReader)
    assert r.latestOffset(r.initialOffset(), ReadMaxRows(100)) == {"t": {"0": 900, "1": 30}}
