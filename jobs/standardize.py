"""The headline job: a member-profile changelog becomes standardized profiles in a Delta table.

    python -m jobs.standardize --pipeline standardize --version 3 --rules jobs/rules/titles/v2.toml ...

Input and output are described with the transform, in `jobs.lib.profiles`: values are JSON
profiles keyed by member id, the output is upserted by member_id, a tombstone deletes the member,
and a record that cannot be used goes to the rejects table with its partition, offset and reason
and leaves the member as it was.

The rules file is loaded and validated before Spark starts (`main`): a bad file ends the process
with the RulesError message, status failed, exit 1, and nothing written. Its content hash goes
into the status and every output commit's metadata.

Each micro-batch runs on the driver in `foreachBatch`:

1. skip it if the output table already has its app transaction (replay after a crash);
2. the batch's records as Arrow: read in the driver from the offset range Spark planned and
   logged (`DriverReader`, the default on a local master), or `toArrow()` through Spark (the
   default on a cluster; `--extra '{"read": "spark"}'` or `"driver"` chooses);
3. `transform_batch` (`jobs.lib.profiles`): JSON parsed by pyarrow, latest offset per key, rules
   applied to the distinct titles and companies;
4. rejects, then the upsert, each one idempotent Delta commit.

Test hook: with `KAPPA_TEST_CRASH_AFTER_COMMIT=<batch id>` in the environment the process dies
(exit 137, no clean-up) right after that batch's output commit and before Spark commits the batch
to its checkpoint, which is the crash the replay test needs.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from jobs.lib.delta_sink import DeltaSink, count_rows
from jobs.lib.kafka import (
    KafkaRange,
    SourceSettings,
    arrow_schema,
    checkpoint_offsets,
    offsets_to_map,
    plan_ranges,
    read_range,
)
from jobs.lib.profiles import DELETED, INPUT_COLUMNS, KEY_COLUMNS, BatchResult, thread_pool, transform_batch
from jobs.lib.rules import Rules, load_rules
from jobs.lib.runtime import JobContext, RunState, Status, parse_args, run, summarize_error
from orchestrator.core.exceptions import ConfigError, KappaError, RulesError
from orchestrator.core.names import app_id

__all__ = ["CRASH_HOOK", "READ_MODES", "DriverReader", "BatchWriter", "load_job_rules", "make_writer", "read_mode",
           "build", "main"]

log = logging.getLogger("kappa.standardize")

CRASH_HOOK = "KAPPA_TEST_CRASH_AFTER_COMMIT"
#: How micro-batches are read (`--extra '{"read": "spark"}'`): in the driver (DriverReader) or
#: through Spark's data path (`toArrow()`).
READ_MODES = ("driver", "spark")


def load_job_rules(path: str | None) -> Rules:
    """The job's rules, validated; RulesError if none given or the file is bad."""
    if not path:
        raise RulesError("the standardize job needs a rules file: pass --rules jobs/rules/titles/<version>.toml")
    return load_rules(path)


class DriverReader:
    """Reads a micro-batch's offset range in the driver, with the Kafka source's own range reader.

    `foreachBatch` + `toArrow()` brings every record to the driver anyway; reading the batch's
    range here instead skips Spark's data path (a Python worker per range, Arrow to JVM rows and
    back to Arrow, executor to driver), which is where most of a reprocess's time goes. Spark still
    plans every micro-batch (admission control, available-now, new partitions), logs its offsets
    in the checkpoint and commits it; the range read is exactly the one Spark planned: from the end
    offsets of the previous batch in `<checkpoint>/offsets/` to this batch's. `read` returns None
    when that range is not known from the checkpoint (batch 0 of a query whose starting offsets
    are not "earliest"), and the caller falls back to `toArrow()`.
    """

    def __init__(self, source_options: dict, checkpoint: str | Path):
        self.settings = SourceSettings.from_options(source_options)
        self.checkpoint = str(checkpoint)

    def read(self, batch_id: int) -> pa.Table | None:
        end = checkpoint_offsets(self.checkpoint, batch_id)
        if end is None:
            return None
        if batch_id == 0:
            if self.settings.starting_offsets != "earliest":
                return None
            start = {}  # every partition from its log start, as the source's initial offsets
        else:
            start = checkpoint_offsets(self.checkpoint, batch_id - 1)
            if start is None:
                return None
        ranges = plan_ranges(offsets_to_map(start), offsets_to_map(end), min_partitions=1,
                             split_min_records=2**62)

        def read_one(r) -> list[pa.RecordBatch]:
            return list(read_range(self.settings, KafkaRange(r.topic, r.partition, r.start, r.end, r.new)))

        # librdkafka fetches and decompresses in its own threads: a few ranges at once are faster
        parts = list(thread_pool().map(read_one, ranges)) if len(ranges) > 1 else [read_one(r) for r in ranges]
        batches = [b for part in parts for b in part]
        table = pa.Table.from_batches(batches, schema=arrow_schema()) if batches else arrow_schema().empty_table()
        return table.select(INPUT_COLUMNS)


class BatchWriter:
    """The foreachBatch function: idempotent, so a replayed micro-batch is skipped before any work.

    Runs on the driver. `end_offsets(batch_id)` gives the batch's end offsets for the commit
    metadata (the job reads them from the Spark checkpoint, where Spark logged them before
    running the batch). `on_batch(batch_id, rows_in, rows_out, rejects, rejects_total)` reports
    progress (the runtime's `ctx.record_batch`).
    """

    def __init__(self, sink: DeltaSink, rules: Rules, *,
                 end_offsets: Callable[[int], dict | None] | None = None,
                 on_batch: Callable[..., None] | None = None,
                 crash_after: int | None = None, reader: DriverReader | None = None):
        self.sink = sink
        self.reader = reader
        self.rules = rules
        self.end_offsets = end_offsets or (lambda batch_id: None)
        self.on_batch = on_batch
        self.crash_after = crash_after
        self.skipped: list[int] = []
        self.timings: list[dict] = []
        self.rejects_total = count_rows(sink.rejects_uri) if sink.rejects_uri else 0

    def __call__(self, df: Any, batch_id: int) -> None:
        entered = time.perf_counter()
        if self.sink.committed(batch_id):
            log.warning("micro-batch %d is already in %s (app transaction %s): skipped (replay after a "
                        "restart)", batch_id, self.sink.table_uri, self.sink.app_id)
            self.skipped.append(batch_id)
            if self.on_batch:
                self.on_batch(batch_id, 0, 0, 0, self.rejects_total)
            return
        t0 = time.perf_counter()
        batch = self.reader.read(batch_id) if self.reader is not None else None
        if batch is None:
            batch = df.select(*INPUT_COLUMNS).toArrow()
        self.process_arrow(batch, batch_id, fetch_seconds=time.perf_counter() - t0, entered=entered)

    def process_arrow(self, batch: pa.Table, batch_id: int, fetch_seconds: float = 0.0,
                      entered: float | None = None) -> BatchResult:
        t1 = time.perf_counter()
        result = transform_batch(batch, self.rules, batch_id)
        t2 = time.perf_counter()
        rej = self.sink.write_rejects(batch_id, result.rejects)
        write = self.sink.upsert(batch_id, result.upserts, KEY_COLUMNS, DELETED,
                                 end_offsets=self.end_offsets(batch_id))
        t3 = time.perf_counter()
        if self.crash_after is not None and batch_id >= self.crash_after:
            log.error("%s=%s: dying after the Delta commit of micro-batch %d, before Spark's checkpoint "
                      "commit", CRASH_HOOK, self.crash_after, batch_id)
            logging.shutdown()
            os._exit(137)
        if not rej.skipped:
            self.rejects_total += rej.rows
        self.timings.append({"batch_id": batch_id, "rows_in": result.rows_in, "fetch": fetch_seconds,
                             "transform": t2 - t1, "write": t3 - t2, **result.seconds,
                             "entered": t1 - fetch_seconds if entered is None else entered, "left": t3})
        log.info("micro-batch %d: %d records in, %d keys upserted (%d tombstones in), %d rejects; fetch %.2fs, "
                 "transform %.2fs (%s), %s %.2fs", batch_id, result.rows_in, result.rows_out,
                 result.tombstones, result.rejects.num_rows, fetch_seconds, t2 - t1,
                 ", ".join(f"{k} {v:.2f}" for k, v in result.seconds.items()), write.operation, t3 - t2)
        if self.on_batch:
            self.on_batch(batch_id, result.rows_in, result.rows_out, result.rejects.num_rows, self.rejects_total)
        return result


def make_writer(args: Any, rules: Rules, on_batch: Callable[..., None] | None = None,
                source_options: dict | None = None) -> BatchWriter:
    """The BatchWriter for the job's arguments (runtime contract) and validated rules.

    With `source_options` (the Kafka source's options) micro-batches are read in the driver
    (`DriverReader`); without, through Spark (`toArrow()`).
    """
    sink = DeltaSink(args.output, args.rejects, app_id(args.pipeline, args.version), {
        "pipeline": args.pipeline, "version": args.version, "rules_hash": rules.content_hash,
        "rules_file": str(rules.path),
    })
    crash = os.environ.get(CRASH_HOOK)
    reader = DriverReader(source_options, args.checkpoint) if source_options is not None else None
    return BatchWriter(sink, rules, end_offsets=lambda b: checkpoint_offsets(args.checkpoint, b),
                       on_batch=on_batch, crash_after=int(crash) if crash else None, reader=reader)


def read_mode(extra: dict | None, master: str = "local") -> str:
    """`driver` on a local master (fastest: one process holds every record anyway); on a cluster,
    `spark`, so that executors do the reading and the driver does not carry every record."""
    read = (extra or {}).get("read", "driver" if master.startswith("local") else "spark")
    if read not in READ_MODES:
        raise ConfigError(f"--extra: \"read\" must be one of {', '.join(READ_MODES)}, got {read!r}")
    return read


def build(ctx: JobContext, rules: Rules | None = None) -> Any:
    """Start the standardize query (runtime contract)."""
    rules = rules or load_job_rules(ctx.args.rules)
    ctx.rules_hash = rules.content_hash
    read = read_mode(ctx.extra, ctx.spark.sparkContext.master)
    writer = make_writer(ctx.args, rules, on_batch=ctx.record_batch,
                         source_options=ctx.source_options() if read == "driver" else None)
    return (
        ctx.read_stream().writeStream
        .queryName(f"standardize_{ctx.args.pipeline}_v{ctx.args.version}")
        .foreachBatch(writer)
        .option("checkpointLocation", ctx.args.checkpoint)
        .trigger(**ctx.trigger_kwargs())
        .start()
    )


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
        read_mode(args.extra)
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
