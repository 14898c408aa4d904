"""What the four seed jobs (`pageviews_hourly`, `profile_settings_join`, `pageview_enrich`,
`ad_click_join`) share around Spark.

Each job's query is one stream of output rows, reject rows and counts of records read
(`TAIL_DDL`), which `SeedBatchWriter` splits in foreachBatch into the version's rejects table and
output table (idempotent Delta commits), and reports to the runtime's status. Parsing the records
themselves is `jobs.lib.events`.

Read progress of the backfill: a new version's first micro-batch reads the whole log as one Spark
batch (``backfill=one-batch``) through Spark's own stateful operators, and the batch commits only
when all of it is read, aggregated or joined and written. Meanwhile its source's reader tasks
report the offsets they have read under ``<checkpoint>/kappa-read-progress`` (`jobs.lib.kafka.progress`,
set up by `JobContext.read_stream`), from which the orchestrator's lag counts the records not read
yet, so lag goes down during the backfill. The consumer group's committed offsets, like the Spark
checkpoint, keep meaning "committed to the version's table": they stay at the log start during the
backfill and move to its end offsets when it commits. A lag reading taken from read progress never
counts toward caught up (`orchestrator.observe.lag`): readiness needs the committed batch.

Test hook, so that a test holds a batch between reading and committing instead of racing it:
``KAPPA_TEST_HOLD_BEFORE_COMMIT=<batch id>`` with ``KAPPA_TEST_HOLD_FILE=<path>``: that batch's
rows are computed (its source read), then the job writes the file and waits, before any Delta
commit, until the test deletes it.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from jobs.lib.delta_sink import DELETED, DeltaSink, count_rows
from jobs.lib.kafka import checkpoint_offsets
from jobs.lib.runtime import JobContext
from orchestrator.core.exceptions import ConfigError
from orchestrator.core.names import app_id

__all__ = [
    "REJECT_COLUMNS", "TAIL_DDL", "TAIL_COLUMNS", "null_columns", "rejects_and_counts", "reject_row",
    "rows_frame", "SeedBatchWriter", "make_writer", "job_topics", "COMMON_OPTIONS", "state_partitions",
    "job_options", "start_query", "HOLD_HOOK", "HOLD_FILE", "hold_if_asked",
]

REJECT_COLUMNS = ["key", "value", "topic", "partition", "offset", "error"]
#: Columns every seed job's stream carries after its output columns. A row is a reject when
#: `error` is set, a count of source records read when `input_rows` is set, else an output row.
TAIL_DDL = ("key binary, value binary, topic string, partition int, offset bigint, error string, "
            "input_rows bigint")
TAIL_COLUMNS = [c.split(" ")[0] for c in TAIL_DDL.split(", ")]


HOLD_HOOK = "KAPPA_TEST_HOLD_BEFORE_COMMIT"
HOLD_FILE = "KAPPA_TEST_HOLD_FILE"


def hold_if_asked(batch_id: int, log: logging.Logger | None = None) -> None:
    """The test hook (see the module): hold this batch before its commits while the file exists."""
    if os.environ.get(HOLD_HOOK) != str(batch_id) or not os.environ.get(HOLD_FILE):
        return
    path = os.environ[HOLD_FILE]
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")
    (log or logging.getLogger("kappa.seedjob")).warning(
        "%s=%s: micro-batch %d read, holding it before its commits until %s is deleted", HOLD_HOOK,
        batch_id, batch_id, path)
    while os.path.exists(path):
        time.sleep(0.05)


def null_columns(ddl: str) -> list[Any]:
    """Spark columns of nulls named and typed as in `ddl` ("a string, b bigint"), for the branch of
    a union that does not have them."""
    from pyspark.sql import functions as F

    return [F.lit(None).cast(t).alias(n) for n, t in (c.strip().split(" ", 1) for c in ddl.split(","))]


def rejects_and_counts(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`mapInArrow` function over `parse_batches` output: its reject rows, plus one row counting
    the records of each non-empty batch (`input_rows`), so the job can report exactly how many
    records it read even though its output holds aggregates or joined pairs. Runs on executors."""
    schema = pa.schema([pa.field("key", pa.binary()), pa.field("value", pa.binary()),
                        pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
                        pa.field("offset", pa.int64()), pa.field("error", pa.string()),
                        pa.field("input_rows", pa.int64())])
    for batch in batches:
        if batch.num_rows == 0:
            continue
        rejects = batch.filter(pc.is_valid(batch.column("error")))
        cols = [rejects.column(n).cast(schema.field(n).type) for n in REJECT_COLUMNS]
        yield pa.RecordBatch.from_arrays(cols + [pa.nulls(rejects.num_rows, pa.int64())], schema=schema)
        yield pa.RecordBatch.from_arrays(
            [pa.nulls(1, f.type) for f in list(schema)[:-1]] + [pa.array([batch.num_rows], pa.int64())],
            schema=schema)


def reject_row(record: Any, error: str) -> dict:
    """A reject row (`TAIL_DDL` columns) of one source record (a pandas itertuples row)."""
    return {"key": record.key, "value": record.value, "topic": record.topic,
            "partition": int(record.partition), "offset": int(record.offset), "error": error}


def rows_frame(rows: list[dict], columns: list[str]) -> Any:
    """The pandas frame a stateful function yields: missing columns and NaN become None (null)."""
    import pandas as pd

    return pd.DataFrame.from_records(rows, columns=columns).astype(object).where(lambda d: d.notna(), None)


class SeedBatchWriter:
    """The foreachBatch function of the seed jobs. Runs on the driver.

    Each job's query yields one stream holding its output rows, its rejects and counts of the
    records read (see `TAIL_DDL`), so a micro-batch is computed once (one `toArrow()`: a
    stateful plan is never evaluated twice) and then split: rejects first, output second, each an
    idempotent Delta commit (`jobs.lib.delta_sink.DeltaSink`); a batch already in the output table is
    neither collected nor written again, only run for its state (see `__call__`). `mode` is
    "upsert" (by `key_columns`; rows with `_deleted` set delete) or "append". `on_batch` is
    `JobContext.record_batch`.
    """

    def __init__(self, sink: DeltaSink, output_schema: pa.Schema, *, mode: str,
                 key_columns: list[str] | None = None,
                 end_offsets: Callable[[int], dict | None] | None = None,
                 on_batch: Callable[..., None] | None = None, log: logging.Logger | None = None):
        if mode not in ("upsert", "append"):
            raise ValueError(f"mode must be 'upsert' or 'append', got {mode!r}")
        self.sink = sink
        self.schema = output_schema
        self.mode = mode
        self.key_columns = key_columns or []
        self.end_offsets = end_offsets or (lambda batch_id: None)
        self.on_batch = on_batch
        self.log = log
        self.skipped: list[int] = []
        self.rejects_total: int | None = None

    def __call__(self, df: Any, batch_id: int) -> None:
        if self.sink.committed(batch_id):
            # A replay after a crash between the Delta commit and Spark's checkpoint commit. Nothing is
            # written, but the plan still runs (into Spark's no-op sink): its stateful operators must
            # commit this batch's state version, or Spark fails the batch (state store commit
            # validation) and the next one would start from the wrong state.
            if self.log:
                self.log.warning("micro-batch %d is already in %s (app transaction %s): not written again "
                                 "(replay after a restart)", batch_id, self.sink.table_uri, self.sink.app_id)
            df.write.format("noop").mode("overwrite").save()
            self.skipped.append(batch_id)
            if self.on_batch:
                self.on_batch(batch_id, 0, 0, 0)
            return
        table = df.toArrow()
        hold_if_asked(batch_id, self.log)
        self.write(table, batch_id)

    def split(self, table: pa.Table, batch_id: int) -> tuple[pa.Table, pa.Table, int]:
        """(output rows in `output_schema` (+ `_deleted` when upserting), rejects with batch_id,
        records read)."""
        is_reject = pc.is_valid(table.column("error"))
        is_count = pc.is_valid(table.column("input_rows"))
        rows_in = pc.sum(table.column("input_rows")).as_py() or 0
        rejects = table.filter(is_reject).select(REJECT_COLUMNS)
        rejects = rejects.append_column("batch_id", pa.array([batch_id] * rejects.num_rows, pa.int64()))
        rows = table.filter(pc.invert(pc.or_(is_reject, is_count)))
        columns = [rows.column(f.name).cast(f.type) for f in self.schema]
        schema = self.schema
        if self.mode == "upsert":
            deleted = (rows.column(DELETED).cast(pa.bool_()) if DELETED in rows.column_names
                       else pa.array([False] * rows.num_rows, pa.bool_()))
            columns.append(pc.fill_null(deleted, False))
            schema = schema.append(pa.field(DELETED, pa.bool_()))
        return pa.Table.from_arrays(columns, schema=schema), rejects, int(rows_in)

    def write(self, table: pa.Table, batch_id: int) -> tuple[pa.Table, pa.Table, int]:
        rows, rejects, rows_in = self.split(table, batch_id)
        if self.rejects_total is None:
            self.rejects_total = count_rows(self.sink.rejects_uri)
        written = self.sink.write_rejects(batch_id, rejects)
        if not written.skipped:
            self.rejects_total += rejects.num_rows
        offsets = self.end_offsets(batch_id)
        if self.mode == "upsert":
            self.sink.upsert(batch_id, rows, self.key_columns, DELETED, end_offsets=offsets)
        else:
            self.sink.append(batch_id, rows, end_offsets=offsets)
        if self.log:
            self.log.info("micro-batch %d: %d records in, %d rows %s, %d rejects", batch_id, rows_in,
                          rows.num_rows, "upserted" if self.mode == "upsert" else "appended",
                          rejects.num_rows)
        if self.on_batch:
            self.on_batch(batch_id, rows_in, rows.num_rows, rejects.num_rows, self.rejects_total)
        return rows, rejects, rows_in


def make_writer(ctx: JobContext, output_schema: pa.Schema, *, mode: str, key_columns: list[str] | None = None,
                log: logging.Logger | None = None) -> SeedBatchWriter:
    """The SeedBatchWriter of a job run by `jobs.lib.runtime` (paths, app id and metadata from its
    arguments; end offsets of each batch from its Spark checkpoint)."""
    args = ctx.args
    sink = DeltaSink(args.output, args.rejects, app_id(args.pipeline, args.version),
                     {"pipeline": args.pipeline, "version": args.version})
    return SeedBatchWriter(sink, output_schema, mode=mode, key_columns=key_columns,
                           end_offsets=lambda b: checkpoint_offsets(args.checkpoint, b),
                           on_batch=ctx.record_batch, log=log)


def job_topics(ctx: JobContext, roles: tuple[str, ...], job: str) -> list[str]:
    """`--topics` split into the job's topic roles, in order; ConfigError when the count differs."""
    topics = list(ctx.args.topics_list)
    if len(topics) != len(roles):
        raise ConfigError(
            f"job {job} reads {len(roles)} topic(s) in this order: {', '.join(roles)}; got --topics "
            f"{','.join(topics)!r}: pass --topics {','.join(f'<{r}>' for r in roles)}")
    return topics


_DURATION = re.compile(r"^\d+ (second|minute|hour|day)s?$")


#: `--extra` options every seed job takes besides its own durations (handled here, not by the job)
COMMON_OPTIONS = ("source_options", "state_partitions")


def state_partitions(ctx: JobContext, job: str) -> int | None:
    """`--extra` ``state_partitions`` (a pipeline's ``options.state_partitions``): the number of
    shuffle partitions, and so of state-store partitions, of the job's stateful operators; None
    keeps the session's ``spark.sql.shuffle.partitions``. ConfigError unless a positive integer.

    It counts at a query's first start only: Spark keeps the number in the checkpoint, because the
    state is partitioned by it; a version restarted from its checkpoint keeps its own.
    """
    raw = (ctx.extra or {}).get("state_partitions")
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, str)) or not str(raw).strip().isdigit() \
            or int(raw) < 1:
        raise ConfigError(f"--extra option 'state_partitions' of job {job} must be a positive integer "
                          f"(the pipeline's options.state_partitions), got {raw!r}")
    return int(raw)


def job_options(ctx: JobContext, defaults: dict[str, str], job: str) -> dict[str, str]:
    """The job-specific `--extra` options (durations such as "10 minutes") over their defaults;
    ConfigError naming an unknown option or a malformed duration. `COMMON_OPTIONS` are left out
    (checked by `state_partitions` and the source)."""
    extra = {k: v for k, v in (ctx.extra or {}).items() if k not in COMMON_OPTIONS}
    state_partitions(ctx, job)
    unknown = sorted(set(extra) - set(defaults))
    if unknown:
        raise ConfigError(f"job {job} has no option {', '.join(map(repr, unknown))} in --extra; "
                          f"known options: {', '.join(sorted(defaults))} (and {', '.join(COMMON_OPTIONS)})")
    out = {**defaults, **extra}
    for k, v in out.items():
        if not isinstance(v, str) or not _DURATION.match(v.strip()):
            raise ConfigError(f"--extra option {k!r} of job {job} must be a duration such as "
                              f"\"10 minutes\" or \"2 hours\", got {v!r}")
        out[k] = v.strip()
    return out


def start_query(ctx: JobContext, df: Any, writer: SeedBatchWriter, *, output_mode: str, job: str) -> Any:
    """Start a seed job's streaming query: foreachBatch into `writer`, the job's checkpoint and
    trigger, its `state_partitions`. Returns the StreamingQuery (the runtime contract of `build(ctx)`).

    The query takes the session's SQL settings when it starts, so the number of state partitions is
    set for the start only and the session's own value restored (tests share one session)."""
    partitions = state_partitions(ctx, job)
    conf = ctx.spark.conf
    key = "spark.sql.shuffle.partitions"
    before = conf.get(key)
    if partitions is not None:
        conf.set(key, str(partitions))
    try:
        return (
            df.writeStream.queryName(f"{job}_{ctx.args.pipeline}_v{ctx.args.version}")
            .outputMode(output_mode)
            .foreachBatch(writer)
            .option("checkpointLocation", ctx.args.checkpoint)
            .trigger(**ctx.trigger_kwargs())
            .start()
        )
    finally:
        if partitions is not None:
            conf.set(key, before)
