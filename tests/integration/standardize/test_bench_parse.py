"""`kappa bench parse` at a small size: every step ran over the same log, the ratios are to from_json's
executor CPU of the same run, and the steps parse what the job parses."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from orchestrator.dev.parsebench import STEPS, parse_lines, run_parse_bench, write_log

pytestmark = pytest.mark.integration


def test_bench_parse_measures_each_step_against_from_json(spark, tmp_path):
    figures = run_parse_bench(3_000, 500, malformed_share=0.05, rounds=2, workdir=tmp_path, spark=spark)
    assert (figures["records"], figures["keys"], figures["rounds"]) == (3_000, 500, 2)
    assert [s["step"] for s in figures["steps"]] == [name for name, _, _ in STEPS]
    ref = next(s for s in figures["steps"] if s["step"] == "from_json")
    assert ref["ratio_to_from_json"] == 1.0
    for s in figures["steps"]:
        assert len(s["rounds"]) == 2 and s["seconds"] == min(r["seconds"] for r in s["rounds"])
        assert s["executor_cpu_seconds"] == min(r["executor_cpu_seconds"] for r in s["rounds"]) > 0
        assert s["ratio_to_from_json"] == round(s["executor_cpu_seconds"] / ref["executor_cpu_seconds"], 3)
    lines = parse_lines(figures)
    assert len(lines) == 1 + len(STEPS) and all(s["step"] in "\n".join(lines) for s in figures["steps"])
    # the log is the reprocess benchmark's, with the Kafka source's columns, and kept in the workdir
    log = pq.read_table(tmp_path / "log.parquet")
    assert log.num_rows == 3_000 and log.column_names == ["key", "value", "topic", "partition", "offset", "timestamp"]
    assert figures["value_bytes"] == sum(len(v or b"") for v in log.column("value").to_pylist())


def test_the_steps_parse_the_log_as_the_job_does(spark, tmp_path):
    """The kappa steps are the job's own parse: parse_records' fields equal the exact parser's on the log
    (malformed records included), and the latest-row step keeps one latest row per key and every reject."""
    from jobs.lib.source.profiles import PROFILE_FIELDS, parse_one

    write_log(tmp_path / "log.parquet", 2_000, 300, malformed_share=0.1)
    src = spark.read.parquet(str(tmp_path / "log.parquet"))
    build = {name: fn for name, _, fn in STEPS}
    got = {(r["partition"], r["offset"]): r for r in build["parse_records"](src).collect()}
    rows = src.collect()
    assert len(got) == len(rows) == 2_000
    rejects = 0
    for rec in rows:
        out = got[(rec["partition"], rec["offset"])]
        if rec["value"] is None:
            assert out["error"] is None and out["_deleted"]
            continue
        fields, reason = parse_one(bytes(rec["value"]))
        assert out["error"] == reason
        rejects += reason is not None
        assert tuple(out[f] for f in PROFILE_FIELDS) == (fields or (None,) * len(PROFILE_FIELDS))
    assert rejects > 0
    from jobs.lib.contract.runner import LATEST, REJECTS

    grouped = build["kappa_latest"](src)   # a row per key with a latest row, and one per distinct reject
    keys = {bytes(r["key"]).decode() for r in rows}
    assert grouped.select("member_id").distinct().count() == len(keys)
    latest = grouped.where(grouped[LATEST].isNotNull())
    assert latest.count() == latest.select("member_id").distinct().count()
    assert grouped.selectExpr(f"sum(size({REJECTS}))").first()[0] == rejects


def test_bench_parse_refuses_an_unknown_step_in_one_line(capsys):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    result = CliRunner().invoke(app, ["bench", "parse", "--records", "10", "--step", "nosuch"])
    assert result.exit_code != 0
    assert "no step 'nosuch'; the steps: read, from_json," in result.output
    assert "Traceback" not in result.output
