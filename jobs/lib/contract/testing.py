"""Helpers for a team's tests of its own jobs (the job contract, `jobs.lib.contract.api`), without Kafka.

    from jobs.lib.contract.testing import local_spark, record, run_job
    from team_jobs.profiles import transform

    def test_titles_are_standardized():
        spark = local_spark()
        table, rejects = run_job(spark, transform, [record("m1", {"name": "Ada", "title": "sr swe"})],
                                 key="member_id", rules="rules/titles/v1.toml")
        assert table == [{"member_id": "m1", "name": "Ada", ...}]

`run_job` gives the job's function what kappa's runner gives it, with a static DataFrame of the
records in place of the Kafka stream (`key, value, topic, partition, offset, timestamp`), and
applies kappa's step of each micro-batch for `Upserts` (`jobs.lib.contract.runner.split_batch`: rejects,
the latest row per key, ``then``): the rows the version's table would hold after that batch, and
the rejects. `local_spark()` is a local Spark session with kappa's settings (one per process).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from jobs.lib.contract.api import DELETED, JobInput, Upserts, check_result

__all__ = ["local_spark", "record", "source_frame", "run_job"]

SOURCE_DDL = "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
_T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
_SESSION: list = []


def local_spark(master: str = "local[1]") -> Any:
    """A local SparkSession (kappa's connectors and settings), created once per process; its scratch
    folder goes when the process exits (Spark removes only what it made inside)."""
    if not _SESSION:
        import atexit
        import shutil
        import tempfile

        from jobs.lib.runtime.session import build_session

        local_dir = tempfile.mkdtemp(prefix="kappa-job-tests-")
        atexit.register(shutil.rmtree, local_dir, ignore_errors=True)
        _SESSION.append(build_session("kappa-job-tests", master=master, local_dir=local_dir))
    return _SESSION[0]


def record(key: str | bytes | None, value: dict | str | bytes | None, *, partition: int = 0,
           topic: str = "topic") -> tuple:
    """One Kafka record for `source_frame`/`run_job`: a dict value is JSON; None is a tombstone."""
    k = key.encode() if isinstance(key, str) else key
    if isinstance(value, dict):
        value = json.dumps(value)
    v = value.encode() if isinstance(value, str) else value
    return (k, v, topic, partition)


def source_frame(spark: Any, records: Iterable[tuple]) -> Any:
    """The records as Spark's Kafka source would give them, offsets in order per partition."""
    rows, next_offset = [], {}
    for i, (k, v, topic, partition) in enumerate(records):
        offset = next_offset.get((topic, partition), 0)
        next_offset[(topic, partition)] = offset + 1
        rows.append((k, v, topic, partition, offset, _T0 + timedelta(milliseconds=i)))
    return spark.createDataFrame(rows, SOURCE_DDL)


def run_job(spark: Any, transform: Callable[[JobInput], Any], records: Iterable[tuple], *, key: str,
            rules: str | Path | None = None, options: dict | None = None, key_order: str = "partition",
            pipeline: str = "test") -> tuple[list[dict], list[dict]]:
    """(table rows sorted by key, without kappa's columns; rejects) of one micro-batch of `records`
    through the job's contract function and kappa's step for `Upserts`."""
    from jobs.lib.contract.runner import output_columns, split_batch
    from jobs.lib.rules.files import load_rules

    source = source_frame(spark, records)
    topics = tuple(sorted({r["topic"] for r in source.select("topic").distinct().collect()})) or ("topic",)
    job = JobInput(spark=spark, source=source, read=lambda topics=None: source, options=dict(options or {}),
                   rules=load_rules(rules) if rules else None, key=(key,), topics=topics, pipeline=pipeline,
                   version=1)
    result = transform(job)
    if not isinstance(result, Upserts):
        raise TypeError("run_job runs Upserts jobs; a Stateful job needs a streaming source")
    check_result("the job", result, (key,), streaming=False)
    rejects, latest = split_batch(result.rows, output_columns(result.rows), key, key_order, result.then)
    kappa = {"source_partition", "source_offset", "source_timestamp", DELETED}
    table = [{c: v for c, v in r.asDict().items() if c not in kappa}
             for r in latest.where("NOT _deleted").orderBy(key).collect()]
    return table, [r.asDict() for r in rejects.orderBy("partition", "offset").collect()]
