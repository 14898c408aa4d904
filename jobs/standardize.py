"""The headline job: a member-profile changelog becomes standardized profiles in a Delta table.

    python -m jobs.standardize --pipeline standardize --version 3 --rules jobs/rules/titles/v2.toml ...

An ordinary Structured Streaming query, as a Spark user writes it:

* source: Spark's Kafka source over the compacted topic (``format("kafka")``, options from kappa's
  runtime, `jobs.lib.runtime.stream`); a version's first micro-batch is its whole backfill;
* transformation (`transform`), DataFrame functions in the JVM: the JSON profile parsed with
  ``try_parse_json`` (`jobs.lib.profiles.parse_records`: values and keys the JVM cannot vouch for go
  to the exact Python parser, which gives the reject reason), the latest record per member by the
  key order, the rules as Spark expressions (`jobs.lib.rules.Rules.column`);
* sink: delta-spark, from foreachBatch (`jobs.lib.sink.DeltaTables`): the rejects appended with their
  partition, offset and reason, then the profiles MERGEd by member_id (a tombstone deletes the
  member), each commit idempotent by Delta's application transaction.

The rules file is loaded and validated before Spark starts (`main`): a bad file ends the process
with the RulesError message, status failed, exit 1, and nothing written. Its content hash goes
into the status and every output commit's metadata.

Options (``[pipelines.<name>.options]``, passed as ``--extra``): ``key_order`` (``partition``:
refuse a key seen in two partitions; ``timestamp``: order by record timestamp, partition, offset),
``backfill`` (``one-batch``: a version's first pass is one micro-batch; ``capped``: capped by
``maxOffsetsPerTrigger`` like the live tail), ``source_options`` (options of Spark's Kafka source,
or ``kafka.*`` client settings).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

from jobs.lib.profiles import DELETED, KEY_COLUMNS, REJECT_COLUMNS, parse_records
from jobs.lib.rules import Rules, load_rules
from jobs.lib.runtime import JobContext, RunState, Status, parse_args, run, summarize_error
from jobs.lib.runtime.backfill import BackfillProgress
from jobs.lib.runtime.stream import (BACKFILL_MODES, check_source_options, fail_on_data_loss, lost_offsets,
                                     needs_backfill, start_stream)
from jobs.lib.sink import CRASH_HOOK, KEY_ORDERS, PARTITIONS, DeltaTables, batch_end_offsets, crash_if_asked, latest_per_key, pause_if_asked
from orchestrator.core.exceptions import ConfigError, KappaError, RulesError, SourceError
from orchestrator.core.names import app_id

__all__ = ["CRASH_HOOK", "JobOptions", "load_job_rules", "transform", "StandardizeBatches", "start_query",
           "build", "main"]

log = logging.getLogger("kappa.standardize")


def load_job_rules(path: str | None) -> Rules:
    """The job's rules, validated; RulesError if none given or the file is bad."""
    if not path:
        raise RulesError("the standardize job needs a rules file: pass --rules jobs/rules/titles/<version>.toml")
    return load_rules(path)


class JobOptions:
    """The job's own options (``--extra``), validated before Spark starts."""

    KNOWN = ("key_order", "backfill", "source_options")

    def __init__(self, extra: dict | None):
        extra = dict(extra or {})
        unknown = sorted(set(extra) - set(self.KNOWN))
        if unknown:
            raise ConfigError(f"--extra: unknown standardize option(s) {', '.join(map(repr, unknown))}; "
                              f"known: {', '.join(self.KNOWN)}")
        self.key_order = str(extra.get("key_order", "partition"))
        if self.key_order not in KEY_ORDERS:
            raise ConfigError(f"--extra: key_order must be one of {', '.join(KEY_ORDERS)}, got {self.key_order!r}")
        self.backfill = str(extra.get("backfill", "one-batch"))
        if self.backfill not in BACKFILL_MODES:
            raise ConfigError(f"--extra: backfill must be one of {', '.join(BACKFILL_MODES)}, got {self.backfill!r}")
        source = extra.get("source_options") or {}
        if not isinstance(source, dict):
            raise ConfigError(f"--extra: source_options must be a table of options, got {source!r}")
        check_source_options(source)


def transform(records: Any, rules: Rules, key_order: str) -> tuple[Any, Any, Any]:
    """One micro-batch of Kafka records -> (rows per record, rejects, one row per touched member).

    The last has the output table's columns and `DELETED` (a tombstone); rejects have the rejects
    table's columns but the batch id."""
    from pyspark.sql import functions as F

    parsed = parse_records(records)
    rejects = parsed.where(F.col("error").isNotNull()).select(
        F.col("key").cast("binary"), F.col("value").cast("binary"), "topic", F.col("partition").cast("int"),
        F.col("offset").cast("long"), "error")
    good = parsed.where(F.col("error").isNull()).select(
        "member_id", "name", F.col("title").alias("title_raw"), F.col("company").alias("company_raw"), "location",
        F.col("partition").cast("int").alias("source_partition"), F.col("offset").alias("source_offset"),
        F.col("timestamp").alias("source_timestamp"), DELETED)
    latest = latest_per_key(good, KEY_COLUMNS[0], key_order)
    out = latest.select(
        "member_id", "name", "title_raw", rules.column("titles", F.col("title_raw")).alias("title"),
        "company_raw", rules.column("companies", F.col("company_raw")).alias("company"), "location",
        "source_partition", "source_offset", "source_timestamp", DELETED,
        *([PARTITIONS] if PARTITIONS in latest.columns else []))
    return parsed, rejects, out


class StandardizeBatches:
    """The foreachBatch function: transform, then rejects and profiles into Delta. Runs on the driver."""

    def __init__(self, spark: Any, args: Any, rules: Rules, options: JobOptions,
                 on_batch: Callable[..., None] | None = None):
        self.rules = rules
        self.options = options
        self.on_batch = on_batch
        self.tables = DeltaTables(args.output, args.rejects, app_id(args.pipeline, args.version),
                                  KEY_COLUMNS[0], key_order=options.key_order, checkpoint=str(args.checkpoint),
                                  metadata={"pipeline": args.pipeline, "pipeline_version": str(args.version),
                                            "rules_hash": rules.content_hash, "rules_file": str(rules.path)})
        self.checkpoint = str(args.checkpoint)
        self.skipped: list[int] = []
        self.timings: list[dict[str, float]] = []
        self.rejects_total: int | None = None
        self.bootstrap_servers = getattr(args, "bootstrap_servers", None)
        self.kafka_config = getattr(args, "kafka_config", None)
        source = (getattr(args, "extra", None) or {}).get("source_options") or {}
        self.fail_on_data_loss = fail_on_data_loss(source)

    def _check_data_loss(self, batch_id: int) -> None:
        """Before the batch is read: records it should read that the log no longer has (see
        `jobs.lib.runtime.stream.lost_offsets`) fail it under failOnDataLoss, else are logged."""
        if self.bootstrap_servers is None:
            return
        start = batch_start_offsets(self.checkpoint, batch_id)
        lost = lost_offsets(start, self.bootstrap_servers, self.kafka_config) if start else []
        if not lost:
            return
        if self.fail_on_data_loss:
            raise SourceError(f"micro-batch {batch_id}: records lost before the version read them: "
                              f"{'; '.join(lost)}. Deploy a new version (it reads the log as it is now), or set "
                              f"failOnDataLoss = false in the pipeline's source_options to go on without them")
        log.warning("micro-batch %d: records lost before the version read them (failOnDataLoss=false, going "
                    "on): %s", batch_id, "; ".join(lost))

    def __call__(self, batch: Any, batch_id: int) -> None:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        if self.tables.committed(batch_id):
            log.info("micro-batch %d is in the table already (a replay after a crash): skipped", batch_id)
            self.skipped.append(batch_id)
            return
        self._check_data_loss(batch_id)
        t0 = time.perf_counter()
        spark = batch.sparkSession
        group = f"kappa-{self.tables.app_id}-batch-{batch_id}"
        spark.sparkContext.setJobGroup(group, f"kappa standardize: micro-batch {batch_id}")
        progress = contextlib.nullcontext()
        end = batch_end_offsets(self.checkpoint, batch_id)
        if needs_backfill(self.checkpoint) and end:
            progress = BackfillProgress(spark, self.checkpoint, group, end)   # lag moves while batch 0 is read
        records = batch.persist(StorageLevel.MEMORY_AND_DISK)
        held = [records]
        try:
            with progress:
                parsed, rejects, out = transform(records, self.rules, self.options.key_order)
                parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK)
                held.append(parsed)
                counts = parsed.agg(F.count(F.lit(1)), F.count("error")).first()
                rows_in, n_rejects = int(counts[0]), int(counts[1])
                if isinstance(progress, BackfillProgress):
                    progress.read()
                t1 = time.perf_counter()
                out = out.persist(StorageLevel.MEMORY_AND_DISK)
                held.append(out)
                rows_out = out.count()
                t2 = time.perf_counter()
                self.tables.check_key_order(batch_id, out)
                pause_if_asked("read", batch_id)
                from jobs.lib.seedjob import hold_if_asked

                hold_if_asked(batch_id, log)
                self.tables.write_rejects(batch_id, rejects.withColumn("batch_id", F.lit(batch_id).cast("long"))
                                          .select(*REJECT_COLUMNS))
                t3 = time.perf_counter()
                pause_if_asked("commit", batch_id)
                self.tables.upsert(batch_id, out, DELETED)
                t4 = time.perf_counter()
        finally:
            for df in held:
                df.unpersist()
        crash_if_asked(batch_id)
        self.timings.append({"batch_id": batch_id, "read_parse_count": t1 - t0, "dedupe_rules": t2 - t1,
                             "rejects": t3 - t2, "merge_commit": t4 - t3})
        log.info("micro-batch %d: %d records, %d members upserted or deleted, %d rejects (%.2f s)", batch_id,
                 rows_in, rows_out, n_rejects, t4 - t0)
        if self.on_batch is not None:
            if self.rejects_total is None:   # counted once (a restart), then kept up to date
                from orchestrator.core.tables import count_rows

                self.rejects_total = count_rows(self.tables.rejects_uri)
            else:
                self.rejects_total += n_rejects
            self.on_batch(batch_id, rows_in, rows_out, n_rejects, self.rejects_total)


def batch_start_offsets(checkpoint: str, batch_id: int) -> dict | None:
    """Where micro-batch `batch_id` starts: the previous batch's end offsets, or the offsets the
    query started from (batch 0, or a partition new since the previous batch: its log start)."""
    from jobs.lib.runtime.backfill import initial_offsets

    start = {}
    for (topic, p), o in (initial_offsets(checkpoint) or {}).items():
        start.setdefault(topic, {})[str(p)] = o
    previous = batch_end_offsets(checkpoint, batch_id - 1) if batch_id > 0 else None
    for topic, parts in (previous or {}).items():
        start.setdefault(topic, {}).update(parts)
    return start or None


def start_query(spark: Any, args: Any, rules: Rules, source_options: dict, trigger: dict, *,
                on_batch: Callable[..., None] | None = None) -> tuple[Any, StandardizeBatches]:
    """Start the standardize query; returns (query, its foreachBatch function). Used by `build`, the
    benchmarks and the tests, so that all of them run the job's own data path."""
    options = JobOptions(getattr(args, "extra", None))
    writer = StandardizeBatches(spark, args, rules, options, on_batch=on_batch)
    query = start_stream(spark, source_options, writer, checkpoint=str(args.checkpoint), trigger=trigger,
                         name=f"standardize_{args.pipeline}_v{args.version}", backfill=options.backfill)
    return query, writer


def build(ctx: JobContext, rules: Rules | None = None) -> Any:
    """Start the standardize query (runtime contract)."""
    rules = rules or load_job_rules(ctx.args.rules)
    ctx.rules_hash = rules.content_hash
    ctx.commit_offsets = True
    query, writer = start_query(ctx.spark, ctx.args, rules, ctx.kafka_options(), ctx.trigger_kwargs(),
                                on_batch=ctx.record_batch)
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
