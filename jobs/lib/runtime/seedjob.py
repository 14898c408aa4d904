"""What the four seed jobs (`pageviews_hourly`, `profile_settings_join`, `pageview_enrich`,
`ad_click_join`) share around Spark.

Each job's query reads Spark's Kafka source (the runtime's options, `jobs.lib.runtime.stream`) and
is one stream of output rows, reject rows and counts of records read (`TAIL_DDL`), which
`SeedBatches` splits in foreachBatch into the version's rejects table and output table with
delta-spark (`jobs.lib.sink.batches`: idempotent commits, data-loss check, backfill read progress, test
hooks). Parsing the records themselves is `jobs.lib.source.events`.

A new version's backfill is one micro-batch (Spark's ``Trigger.AvailableNow`` without a cap, then
the job's own trigger on the same checkpoint), read through Spark's own stateful operators: it
commits only when all of it is read, aggregated or joined and written. Meanwhile
`jobs.lib.runtime.backfill.BackfillProgress` reports how far its tasks got, so lag goes down
during the backfill; readiness needs the committed batch.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from jobs.lib.runtime.context import JobContext
from jobs.lib.runtime.session import session_settings
from jobs.lib.runtime.stream import BACKFILL_MODES, start_stream
from jobs.lib.sink.batches import MicroBatches, Prepared
from jobs.lib.sink.tables import DeltaTables
from jobs.lib.source.profiles import DELETED
from orchestrator.core.exceptions import ConfigError
from orchestrator.core.paths import app_id

__all__ = [
    "REJECT_COLUMNS", "TAIL_DDL", "TAIL_COLUMNS", "null_columns", "rejects_and_counts", "reject_row",
    "rows_frame", "SeedBatches", "topic_roles", "state_partitions", "duration_options", "backfill_mode",
    "start_query", "start_stateful",
]

REJECT_COLUMNS = ["key", "value", "topic", "partition", "offset", "error"]
#: Columns every seed job's stream carries after its output columns. A row is a reject when
#: `error` is set, a count of source records read when `input_rows` is set, else an output row.
TAIL_DDL = ("key binary, value binary, topic string, partition int, offset bigint, error string, "
            "input_rows bigint")
TAIL_COLUMNS = [c.split(" ")[0] for c in TAIL_DDL.split(", ")]


def null_columns(ddl: str) -> list[Any]:
    """Spark columns of nulls named and typed as in `ddl` ("a string, b bigint"), for the branch of
    a union that does not have them."""
    from pyspark.sql import functions as F

    return [F.lit(None).cast(t).alias(n) for n, t in (c.strip().split(" ", 1) for c in ddl.split(","))]


def rejects_and_counts(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`mapInArrow` function over `jobs.lib.source.event_columns.parse_events` output: its reject rows, plus one row counting
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


class SeedBatches(MicroBatches):
    """The foreachBatch function of the seed jobs (`jobs.lib.sink.batches`). Runs on the driver.

    Each job's query yields one stream holding its output rows, its rejects and counts of the
    records read (see `TAIL_DDL`); a micro-batch is persisted, so its stateful plan runs once, then
    split. `mode` is "upsert" (by `key_columns`; rows with `_deleted` set delete; one row per key and
    batch, as the stateful operators emit them) or "append". `on_batch` is `JobContext.record_batch`.
    """

    stateful = True

    def __init__(self, args: Any, output_schema: pa.Schema | list[str], *, mode: str, key_columns: list[str] | None = None,
                 name: str, on_batch: Callable[..., None] | None = None, log: logging.Logger | None = None):
        if mode not in ("upsert", "append"):
            raise ValueError(f"mode must be 'upsert' or 'append', got {mode!r}")
        if mode == "upsert" and not key_columns:
            raise ValueError("an upsert needs its key columns")
        tables = DeltaTables(args.output, args.rejects, app_id(args.pipeline, args.version),
                             list(key_columns or [list(getattr(output_schema, "names", output_schema))[0]]),
                             key_order=None,
                             checkpoint=str(args.checkpoint),
                             metadata={"pipeline": args.pipeline, "pipeline_version": str(args.version)})
        super().__init__(args, tables, name=name, on_batch=on_batch, log=log)
        self.columns = list(getattr(output_schema, "names", output_schema))
        self.mode = mode

    def prepare(self, batch: Any, batch_id: int) -> Prepared:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        b = batch.persist(StorageLevel.MEMORY_AND_DISK)
        kept = F.col("error").isNull() & F.col("input_rows").isNull()
        counts = b.agg(F.coalesce(F.sum("input_rows"), F.lit(0)), F.count("error"), F.count_if(kept)).first()
        rejects = b.where(F.col("error").isNotNull()).select(
            *REJECT_COLUMNS, F.lit(batch_id).cast("long").alias("batch_id"))
        rows = b.where(kept)
        cols = [F.col(c) for c in self.columns]
        if self.mode == "upsert":
            deleted = F.col(DELETED) if DELETED in b.columns else F.lit(False)
            cols.append(F.coalesce(deleted.cast("boolean"), F.lit(False)).alias(DELETED))
        rows = rows.select(*cols)
        return Prepared(rows_in=int(counts[0]), rejects=rejects, n_rejects=int(counts[1]), output=rows,
                        rows_out=int(counts[2]), held=[b])

    def write(self, batch_id: int, output: Any, rows: int) -> None:
        if self.mode == "upsert":
            self.tables.upsert(batch_id, output, DELETED, rows=rows)
        else:
            self.tables.append(batch_id, output)


def topic_roles(job: Any, roles: tuple[str, ...], name: str) -> list[str]:
    """The pipeline's topics as the job's topic roles, in order; ConfigError when the count differs."""
    topics = list(job.topics)
    if len(topics) != len(roles):
        raise ConfigError(
            f"job {name} reads {len(roles)} topic(s) in this order: {', '.join(roles)}; the pipeline has "
            f"{','.join(topics)!r}: set topics = [{', '.join(f'<{r}>' for r in roles)}] in the pipelines file")
    return topics


_DURATION = re.compile(r"^\d+ (second|minute|hour|day)s?$")


def state_partitions(ctx: Any, job: str) -> int | None:
    """`--extra` ``state_partitions`` (a pipeline's ``options.state_partitions``): the number of
    shuffle partitions, and so of state-store partitions, of the job's stateful operators; None
    keeps the session's ``spark.sql.shuffle.partitions``. ConfigError unless a positive integer.

    It counts at a query's first start only: Spark keeps the number in the checkpoint, because the
    state is partitioned by it; a version restarted from its checkpoint keeps its own.
    """
    raw = (getattr(ctx, "extra", ctx) or {}).get("state_partitions")
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, str)) or not str(raw).strip().isdigit() \
            or int(raw) < 1:
        raise ConfigError(f"option 'state_partitions' must be a positive integer (the pipeline's "
                          f"options.state_partitions), got {raw!r}")
    return int(raw)


def backfill_mode(ctx: JobContext) -> str:
    """`--extra` ``backfill``: ``one-batch`` (default: a version's first pass is one micro-batch) or
    ``capped`` (capped by ``maxOffsetsPerTrigger`` like the live tail); ConfigError otherwise."""
    mode = (ctx.extra or {}).get("backfill", "one-batch")
    if mode not in BACKFILL_MODES:
        raise ConfigError(f"--extra: backfill must be one of {', '.join(BACKFILL_MODES)}, got {mode!r}")
    return mode


def duration_options(job: Any, defaults: dict[str, str], name: str) -> dict[str, str]:
    """The job's own options (durations such as "10 minutes") over their defaults; ConfigError naming
    an unknown option or a malformed duration."""
    unknown = sorted(set(job.options) - set(defaults))
    if unknown:
        raise ConfigError(f"job {name} has no option {', '.join(map(repr, unknown))}; its options: "
                          f"{', '.join(sorted(defaults)) or 'none'} (and kappa's: key_order, backfill, "
                          f"source_options, upkeep, state_partitions)")
    out = {**defaults, **job.options}
    for k, v in out.items():
        if not isinstance(v, str) or not _DURATION.match(v.strip()):
            raise ConfigError(f"option {k!r} of job {name} must be a duration such as "
                              f"\"10 minutes\" or \"2 hours\", got {v!r}")
        out[k] = v.strip()
    return out


def start_query(ctx: JobContext, build: Callable[..., Any], writer: SeedBatches, *, output_mode: str,
                job: str) -> Any:
    """Start a seed job's streaming query on Spark's Kafka source: `build(read)` makes its DataFrame
    (``read()`` the stream over all of ``--topics``, ``read(topic)`` one over a topic), foreachBatch
    into `writer`, the version's checkpoint and trigger, its `state_partitions`; the backfill is one
    micro-batch unless ``backfill = "capped"``. Returns the StreamingQuery (the runtime contract of `build(ctx)`).

    The query takes the session's SQL settings when it starts, so the number of state partitions is
    set for the start only and the session's own value restored (tests share one session)."""
    partitions = state_partitions(ctx, job)
    ctx.stage_timings = writer.timings
    with session_settings(ctx.spark, {"spark.sql.shuffle.partitions": None if partitions is None else str(partitions)}):
        return start_stream(ctx.spark, ctx.kafka_options(), writer, checkpoint=str(ctx.args.checkpoint),
                            trigger=ctx.trigger_kwargs(), name=f"{job}_{ctx.args.pipeline}_v{ctx.args.version}",
                            build=build, output_mode=output_mode, backfill=backfill_mode(ctx))


def start_stateful(ctx: JobContext, ref: str, probe: Any, make: Callable[..., Any], key: tuple[str, ...],
                   name: str) -> Any:
    """Start a `jobs.lib.contract.api.Stateful` job: its rows, and the rejects and input counts kappa takes
    from its ``parsed`` records, as one stream into `SeedBatches`. `probe` is what the job returned
    when first called; `make(read)` calls it again for each query start."""
    from pyspark.sql import functions as F

    from jobs.lib.contract.api import DELETED as DELETED_COLUMN, check_result

    columns = list(probe.rows.columns)
    output = [c for c in columns if c not in (DELETED_COLUMN, *TAIL_COLUMNS)]
    fields = list(probe.rows.schema.fields)
    writer = SeedBatches(ctx.args, output, mode=probe.write, key_columns=list(key), name=name,
                         on_batch=ctx.record_batch, log=logging.getLogger(f"kappa.{name}"))

    def build(read):
        res = check_result(ref, make(read), key)
        if all(c in columns for c in TAIL_COLUMNS):   # the rows carry their rejects and counts
            return res.rows
        rows = res.rows.select(*columns, *null_columns(TAIL_DDL))
        if res.parsed is None:
            return rows
        side = res.parsed.mapInArrow(rejects_and_counts, TAIL_DDL).select(
            *[F.lit(None).cast(f.dataType).alias(f.name) for f in fields], *TAIL_COLUMNS)
        return rows.unionByName(side)
    return start_query(ctx, build, writer, output_mode=probe.output_mode, job=name)
