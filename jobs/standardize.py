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
or ``kafka.*`` client settings), ``upkeep`` (`jobs.lib.upkeep`: OPTIMIZE and VACUUM).
"""

from __future__ import annotations

import logging
import sys
from functools import partial
from pathlib import Path
from typing import Any, Callable

from jobs.lib.profiles import DELETED, KEY_COLUMNS, REJECT_COLUMNS, parse_records
from jobs.lib.rules import Rules, load_rules
from jobs.lib.runtime import JobContext, RunState, Status, parse_args, run, summarize_error
from jobs.lib.batches import MicroBatches, Prepared
from jobs.lib.runtime.stream import BACKFILL_MODES, check_source_options, start_stream
from jobs.lib.upkeep import Upkeep
from jobs.lib.sink import CRASH_HOOK, KEY_ORDERS, PARTITIONS, DeltaTables, latest_per_key
from orchestrator.core.exceptions import ConfigError, KappaError, RulesError
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

    KNOWN = ("key_order", "backfill", "source_options", "upkeep")

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
        Upkeep.from_options([], extra.get("upkeep"))


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


class StandardizeBatches(MicroBatches):
    """The foreachBatch function: transform, then rejects and profiles into Delta (`jobs.lib.batches`)."""

    def __init__(self, spark: Any, args: Any, rules: Rules, options: JobOptions,
                 on_batch: Callable[..., None] | None = None):
        tables = DeltaTables(args.output, args.rejects, app_id(args.pipeline, args.version),
                             KEY_COLUMNS[0], key_order=options.key_order, checkpoint=str(args.checkpoint),
                             metadata={"pipeline": args.pipeline, "pipeline_version": str(args.version),
                                       "rules_hash": rules.content_hash, "rules_file": str(rules.path)})
        super().__init__(args, tables, name="standardize", on_batch=on_batch, log=log)
        self.rules = rules
        self.options = options

    def prepare(self, batch: Any, batch_id: int) -> Prepared:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        held = [batch.persist(StorageLevel.MEMORY_AND_DISK)]
        parsed, rejects, out = transform(held[0], self.rules, self.options.key_order)
        held.append(parsed.persist(StorageLevel.MEMORY_AND_DISK))
        counts = parsed.agg(F.count(F.lit(1)), F.count("error")).first()
        held.append(out.persist(StorageLevel.MEMORY_AND_DISK))
        rejects = rejects.withColumn("batch_id", F.lit(batch_id).cast("long")).select(*REJECT_COLUMNS)
        return Prepared(rows_in=int(counts[0]), rejects=rejects, n_rejects=int(counts[1]), output=out,
                        rows_out=out.count(), held=held)

    def check(self, batch_id: int, prepared: Prepared) -> None:
        self.tables.check_key_order(batch_id, prepared.output)

    def write(self, batch_id: int, output: Any) -> None:
        self.tables.upsert(batch_id, output, DELETED)


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
