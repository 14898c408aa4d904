"""The benchmarks' pure parts: percentiles, rates and ratios, sizes, the reference's partition
assignment, the time breakdown from Spark's progress, and what is printed. No services."""

from __future__ import annotations

import pytest

from orchestrator.core.exceptions import ConfigError
from orchestrator.dev.bench import breakdown_lines, reprocess_figures
from orchestrator.dev.benchjob import job_argv, spark_breakdown, stage_totals
from orchestrator.dev.benchref import assign_partitions
from orchestrator.dev.benchutil import parse_count, parse_counts, parse_json_object, percentile, rate, ratio


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
    ([1.0, 2.0, 3.0, 4.0], 99, 3.97),
    ([4.0, 1.0, 3.0, 2.0], 0, 1.0),
    ([4.0, 1.0, 3.0, 2.0], 100, 4.0),
    ([7.5], 99, 7.5),
    (list(range(1, 101)), 50, 50.5),
])
def test_percentile_interpolates_between_ranks_like_numpy(values, q, expected):
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_of_nothing_is_none_and_a_bad_rank_is_refused():
    assert percentile([], 50) is None
    with pytest.raises(ConfigError, match="between 0 and 100, got 101"):
        percentile([1.0], 101)


def test_rate_and_ratio():
    assert rate(2_000_000, 400_000_000, 10.0) == {"records": 2_000_000, "bytes": 400_000_000, "seconds": 10.0,
                                                  "records_per_s": 200_000, "mb_per_s": 40.0}
    assert rate(0, 0, 0)["records_per_s"] == 0  # no division by zero
    assert ratio(156_000, 390_000) == 0.4
    assert ratio(1.0, 0) is None and ratio(None, 2.0) is None and ratio(1.0, None) is None


@pytest.mark.parametrize(("text", "n"), [("4M", 4_000_000), ("1m", 1_000_000), ("250k", 250_000),
                                         ("1.5M", 1_500_000), (" 20000 ", 20_000), (3, 3)])
def test_parse_count(text, n):
    assert parse_count(text) == n


@pytest.mark.parametrize(("text", "message"), [
    ("4G", "'4G' is not a record count: write e.g. 1000000, 250k or 4M"),
    ("0", "must be at least 1 record, got '0'"),
    ("-3", "is not a record count"),
])
def test_parse_count_refuses_with_one_line(text, message):
    with pytest.raises(ConfigError, match=message) as e:
        parse_count(text)
    assert "\n" not in str(e.value)


def test_parse_counts_keeps_order_and_refuses_empty_or_repeated_sizes():
    assert parse_counts("1M,4M") == [1_000_000, 4_000_000]
    assert parse_counts("40000, 20000") == [40_000, 20_000]
    with pytest.raises(ConfigError, match="--sizes names no size: write e.g. 1M,4M"):
        parse_counts(" , ")
    with pytest.raises(ConfigError, match="--sizes gives '1000k' twice"):
        parse_counts("1M,1000k")
    with pytest.raises(ConfigError, match="--sizes item 'x' is not a record count"):
        parse_counts("1M,x")


def test_parse_json_object():
    assert parse_json_object(None) == {} and parse_json_object("  ") == {}
    assert parse_json_object('{"read": "spark"}') == {"read": "spark"}
    with pytest.raises(ConfigError, match=r"--extra is not valid JSON \(Expecting value at character 0\)"):
        parse_json_object("read=spark")
    with pytest.raises(ConfigError, match="--extra must be a JSON object, .* got list"):
        parse_json_object("[1]")


@pytest.mark.parametrize(("partitions", "processes", "expected"), [
    (4, 2, [[0, 2], [1, 3]]),
    (3, 2, [[0, 2], [1]]),
    (4, 4, [[0], [1], [2], [3]]),
    (1, 4, [[0]]),
    (5, 1, [[0, 1, 2, 3, 4]]),
])
def test_reference_partitions_are_dealt_round_robin_none_empty(partitions, processes, expected):
    assert assign_partitions(partitions, processes) == expected


@pytest.mark.parametrize("partitions,processes", [(n, p) for n in range(1, 13) for p in range(1, 6)])
def test_every_partition_goes_to_exactly_one_reader_and_shares_differ_by_one_at_most(partitions, processes):
    groups = assign_partitions(partitions, processes)
    assert sorted(p for g in groups for p in g) == list(range(partitions))
    assert len(groups) == min(partitions, processes)
    assert max(map(len, groups)) - min(map(len, groups)) <= 1


def test_reference_assignment_refuses_nonsense():
    with pytest.raises(ConfigError, match="--reference-processes must be at least 1, got 0"):
        assign_partitions(4, 0)
    with pytest.raises(ConfigError, match="the topic has 0 partitions"):
        assign_partitions(0, 2)


def _progress(batch: int, ts: str, rows: int, **ms) -> dict:
    return {"batchId": batch, "timestamp": ts, "numInputRows": rows, "durationMs": ms}


def test_spark_breakdown_from_progress_reports():
    from datetime import datetime

    start = datetime.fromisoformat("2026-11-23T10:00:00+00:00").timestamp()
    progress = [
        _progress(0, "2026-11-23T10:00:01.500Z", 1000, latestOffset=100, walCommit=50, getBatch=0, queryPlanning=350,
                  addBatch=4000, commitOffsets=40, triggerExecution=4600),
        _progress(1, "2026-11-23T10:00:06.200Z", 500, latestOffset=20, walCommit=30, queryPlanning=50,
                  addBatch=1000, commitOffsets=30, triggerExecution=1200),
        _progress(2, "2026-11-23T10:00:07.400Z", 0, latestOffset=10, triggerExecution=10),  # nothing read
    ]
    b = spark_breakdown(progress, start, 7.6)
    assert b["until_first_trigger"] == 1.5
    assert b["first_batch_planning"] == 0.5
    assert (b["addBatch"], b["commitOffsets"], b["latestOffset"], b["batches"]) == (5.0, 0.07, 0.12, 2.0)
    assert b["after_last_trigger"] == pytest.approx(0.19)  # 7.6 - (7.4 + 0.01)
    assert spark_breakdown([], start, 3.0)["batches"] == 0.0


def test_stage_totals_sum_durations_and_skip_ids_and_clocks():
    timings = [{"batch_id": 0, "rows_in": 10, "entered": 5.0, "left": 9.0, "fetch": 1.0, "write": 0.5},
               {"batch_id": 1, "rows_in": 10, "entered": 9.5, "left": 12.0, "fetch": 0.5, "commit": 0.25,
                "note": "x", "ok": True}]
    assert stage_totals(timings) == {"fetch": 1.5, "write": 0.5, "commit": 0.25}
    assert stage_totals(None) == {}


def test_the_job_runs_with_the_runtime_arguments_of_an_available_now_reprocess(tmp_path):
    from jobs.lib.runtime.args import parse_args

    args = parse_args(job_argv({"bootstrap": "127.0.0.1:9092", "topic": "t", "work": str(tmp_path),
                                "rules_file": "jobs/rules/titles/v2.toml", "max_records_per_batch": 1000,
                                "master": "local[2]", "extra": {"read": "spark"}, "kafka_config": {}}))
    assert (args.trigger, args.topics_list, args.max_records_per_batch, args.extra) == (
        "available-now", ["t"], 1000, {"read": "spark"})
    assert args.output == str(tmp_path / "out") and args.rejects == str(tmp_path / "out__rejects")


def _job(stages: dict) -> dict:
    return {"startup": 5.0, "seconds": 10.0, "batches": 4, "master": "local[2]", "stages": stages,
            "stages_exposed": bool(stages), "peak_memory_bytes": 1_234_000_000,
            "spark": {"until_first_trigger": 0.6, "first_batch_planning": 0.2, "addBatch": 8.0, "commitOffsets": 0.3,
                      "latestOffset": 0.1, "walCommit": 0.1, "getBatch": 0.0, "queryPlanning": 0.4,
                      "after_last_trigger": 0.1, "triggers": 9.0, "batches": 4.0}}


def test_reprocess_figures_and_the_printed_breakdown():
    f = reprocess_figures(_job({"fetch": 2.0, "transform": 3.5}), 400_000_000, 2_000_000)
    assert f["reprocess"]["records_per_s"] == 200_000 and f["reprocess"]["mb_per_s"] == 40.0
    assert f["reprocess_with_startup"]["seconds"] == 15.0
    assert f["time_breakdown_seconds"]["query_start_to_first_batch"] == 0.8
    assert f["peak_memory_mb"] == 1234
    f.update(reference={"processes": 2, "records_per_s": 690_000, "mb_per_s": 140.0},
             raw_consumer={"records_per_s": 390_000}, ratio_to_reference=0.29, ratio_to_one_consumer=0.513)
    lines = breakdown_lines(f)
    assert lines[0] == ("ratio to the reference (2 consumer processes): 0.290 of 690,000 records/s, 140.0 MB/s; "
                        "to one consumer: 0.513")
    assert "Spark start-up 5.00; query start to first batch 0.80 (to the first trigger 0.60, its planning 0.20)" in lines[1]
    assert "addBatch 8.00, commitOffsets 0.30" in lines[1]
    assert lines[2] == "the job's own stages (s, summed over batches): fetch 2.00, transform 3.50"
    assert lines[3].endswith("1,234 MB")

    # the plain pipeline's start to first batch beside kappa's (the floor of Spark's own query start)
    f.update(plain_spark={"records_per_s": 400_000, "mb_per_s": 80.0, "rows": 10, "query_start_to_first_batch": 0.75,
                          "until_first_trigger": 0.5}, ratio_to_plain_spark=0.5)
    assert ("query start to first batch 0.80 (to the first trigger 0.60, its planning 0.20; the plain Spark "
            "pipeline's 0.75, to its first trigger 0.50)") in breakdown_lines(f)[2]

    bare = reprocess_figures(_job({}), 400_000_000, 2_000_000)
    assert "not exposed" in breakdown_lines(bare)[1]
