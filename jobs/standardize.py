"""The headline job: a member-profile changelog becomes standardized profiles in a Delta table.

    python -m jobs.standardize --pipeline standardize --version 3 --rules jobs/rules/titles/v2.toml ...

Input and output are described with the transform, in `jobs.lib.profiles`: values are JSON
profiles keyed by member id, the output is upserted by member_id, a tombstone deletes the member,
and a record that cannot be used goes to the rejects table with its partition, offset and reason
and leaves the member as it was.

The rules file is loaded and validated before Spark starts (`main`): a bad file ends the process
with the RulesError message, status failed, exit 1, and nothing written. Its content hash goes
into the status and every output commit's metadata.

The data path (DESIGN.md): the query reads ``format("kappa_kafka_ranges")``, whose micro-batch rows
are the offset ranges Spark planned, and `jobs.lib.bucketed.UpsertBatches` maps them over Spark
tasks that read, parse, apply the rules and stage their rows by bucket, then over tasks that merge
each touched bucket into a new data file; the driver commits one Delta transaction per micro-batch
(`jobs.lib.bucketed.table`). The records never pass through the driver or the JVM.

A version's first micro-batch is its whole backfill (offset zero to the log end when it starts,
no per-partition caps, see the Kafka source's ``backfill`` option); later micro-batches follow the
live log under ``maxOffsetsPerTrigger``. While the backfill runs, its tasks report how far they have
read under ``<checkpoint>/kappa-read-progress`` (`jobs.lib.kafka.progress`), so the version's lag
goes down before the batch commits; reports a dead run left there are dropped when the query starts.

Options (``[pipelines.<name>.options]``, passed as ``--extra``): ``buckets`` (32: the table's bucket
count, fixed when the table is created), ``key_order`` (``partition``: refuse a key seen in two
partitions; ``timestamp``: order by record timestamp, partition, offset), ``max_records_per_task``
(125000), ``vacuum_hours`` (1: how long files a commit replaced are kept for readers).
"""

from __future__ import annotations

import logging
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from jobs.lib.bucketed.batch import CRASH_HOOK, UpsertBatches
from jobs.lib.bucketed.table import BucketedTable
from jobs.lib.bucketed.tasks import KEY_ORDERS
from jobs.lib.delta_sink import REJECTS_SCHEMA
from jobs.lib.kafka.options import SourceSettings
from jobs.lib.kafka.progress import clear as clear_progress, progress_dir
from jobs.lib.kafka.ranges import RANGES_NAME, TASK_RECORDS, KafkaRangesDataSource
from jobs.lib.profiles import INPUT_COLUMNS, KEY_COLUMNS, OUTPUT_SCHEMA, BatchResult, transform_batch
from jobs.lib.rules import Rules, load_rules
from jobs.lib.runtime import JobContext, RunState, Status, parse_args, run, summarize_error
from orchestrator.core.exceptions import ConfigError, KappaError, RulesError
from orchestrator.core.names import app_id

__all__ = ["CRASH_HOOK", "DEFAULT_BUCKETS", "JobOptions", "load_job_rules", "job_options", "transform",
           "make_writer", "start_query", "build", "main"]

log = logging.getLogger("kappa.standardize")

DEFAULT_BUCKETS = 32


def load_job_rules(path: str | None) -> Rules:
    """The job's rules, validated; RulesError if none given or the file is bad."""
    if not path:
        raise RulesError("the standardize job needs a rules file: pass --rules jobs/rules/titles/<version>.toml")
    return load_rules(path)


class JobOptions:
    """The job's own options (``--extra``), validated before Spark starts."""

    KNOWN = ("buckets", "key_order", "max_records_per_task", "vacuum_hours", "source_options")

    def __init__(self, extra: dict | None):
        extra = dict(extra or {})
        unknown = sorted(set(extra) - set(self.KNOWN))
        if unknown:
            raise ConfigError(f"--extra: unknown standardize option(s) {', '.join(map(repr, unknown))}; "
                              f"known: {', '.join(self.KNOWN)}")
        self.buckets = _positive_int(extra, "buckets", DEFAULT_BUCKETS, 1024)
        self.max_records_per_task = _positive_int(extra, "max_records_per_task", TASK_RECORDS, 2**40)
        self.key_order = str(extra.get("key_order", "partition"))
        if self.key_order not in KEY_ORDERS:
            raise ConfigError(f"--extra: key_order must be one of {', '.join(KEY_ORDERS)}, got {self.key_order!r}")
        try:
            self.vacuum_hours = float(extra.get("vacuum_hours", 1.0))
        except (TypeError, ValueError):
            raise ConfigError(f"--extra: vacuum_hours must be a number of hours, got {extra.get('vacuum_hours')!r}") from None
        if self.vacuum_hours < 0:
            raise ConfigError(f"--extra: vacuum_hours must be 0 or more, got {self.vacuum_hours}")


def _positive_int(extra: dict, name: str, default: int, most: int) -> int:
    raw = extra.get(name, default)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= most:
        raise ConfigError(f"--extra: {name} must be a whole number from 1 to {most}, got {raw!r}")
    return raw


def job_options(extra: dict | None) -> JobOptions:
    return JobOptions(extra)


def transform(rules: Rules, records: pa.Table, batch_id: int) -> BatchResult:
    """Runs in Spark tasks: one offset range's records -> upserts and rejects (`jobs.lib.profiles`)."""
    return transform_batch(records.select(INPUT_COLUMNS), rules, batch_id)


def make_writer(args: Any, rules: Rules, source_options: dict, *, options: JobOptions | None = None,
                on_batch: Callable[..., None] | None = None,
                on_read: Callable[[int, int, int], None] | None = None) -> UpsertBatches:
    """The foreachBatch callable for the job's arguments (runtime contract) and validated rules."""
    options = options or JobOptions(getattr(args, "extra", None))
    table = BucketedTable(args.output, args.rejects, app_id(args.pipeline, args.version),
                          OUTPUT_SCHEMA, buckets=options.buckets, key_column=KEY_COLUMNS[0], rejects_schema=REJECTS_SCHEMA,
                          vacuum_hours=options.vacuum_hours,
                          metadata={"pipeline": args.pipeline, "version": args.version,
                                    "rules_hash": rules.content_hash, "rules_file": str(rules.path)})
    crash = os.environ.get(CRASH_HOOK)
    settings = SourceSettings.from_options({k: v for k, v in source_options.items()
                                            if k.lower() != "maxrecordspertask"})
    return UpsertBatches(table, settings, partial(transform, rules), KEY_COLUMNS[0], key_order=options.key_order,
                         on_batch=on_batch, on_read=on_read, crash_after=int(crash) if crash else None,
                         checkpoint=str(args.checkpoint), task_records=options.max_records_per_task,
                         progress=progress_dir(args.checkpoint))


def start_query(spark: Any, args: Any, rules: Rules, source_options: dict, trigger: dict, *,
                on_batch: Callable[..., None] | None = None,
                on_read: Callable[[int, int, int], None] | None = None) -> tuple[Any, UpsertBatches]:
    """Start the standardize query; returns (query, its foreachBatch writer). Used by `build`, the
    benchmarks and the tests, so that all of them run the job's own data path."""
    options = JobOptions(getattr(args, "extra", None))
    spark.dataSource.register(KafkaRangesDataSource)
    writer = make_writer(args, rules, source_options, options=options, on_batch=on_batch, on_read=on_read)
    if writer.progress:
        clear_progress(writer.progress)   # the query has not started: reports found now are a dead run's
    reader = spark.readStream.format(RANGES_NAME).option("maxRecordsPerTask", str(options.max_records_per_task))
    for k, v in source_options.items():
        reader = reader.option(k, v)
    query = (reader.load().writeStream
             .queryName(f"standardize_{args.pipeline}_v{args.version}")
             .foreachBatch(writer)
             .option("checkpointLocation", str(args.checkpoint))
             .trigger(**trigger)
             .start())
    return query, writer


def build(ctx: JobContext, rules: Rules | None = None) -> Any:
    """Start the standardize query (runtime contract)."""
    rules = rules or load_job_rules(ctx.args.rules)
    ctx.rules_hash = rules.content_hash

    def on_read(batch_id: int, done: int, total: int) -> None:
        ctx.status.update(reading={"batch_id": batch_id, "records_read": done, "records_total": total})

    def on_batch(batch_id: int, *counts: Any) -> None:
        ctx.record_batch(batch_id, *counts)
        if ctx.status.data.get("reading"):
            ctx.status.update(reading=None)

    query, writer = start_query(ctx.spark, ctx.args, rules, ctx.source_options(), ctx.trigger_kwargs(),
                                on_batch=on_batch, on_read=on_read)
    ctx.stage_timings = writer.timings   # per-batch seconds by stage, for the benchmarks
    return query


def main(argv: list[str] | None = None) -> None:
    """`python -m jobs.standardize`: the rules (and --extra) are validated before Spark starts.

    A bad rules file ends the process at once: status.json says failed with the RulesError, exit
    1, no Spark, no query, nothing written.
    """
    try:
        args = parse_args(argv)
    except Exception:
        return run(build, argv)  # the runtime reports bad arguments its own way
    try:
        rules = load_job_rules(args.rules)
        JobOptions(args.extra)
    except KappaError as e:
        run_dir = Path(args.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        status = Status(run_dir / "status.json", args.pipeline, args.version, args.trigger)
        status.update(state=RunState.FAILED, error=summarize_error(e))
        print(f"job {args.pipeline} v{args.version} failed before starting: {summarize_error(e)}", flush=True)
        sys.exit(1)
    run(partial(build, rules=rules), argv)


if __name__ == "__main__":
    main()
