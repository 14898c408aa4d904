"""kappa's side of the job contract (`jobs.lib.contract.api`): every pipeline's job runs through here.

    python -m jobs.run --job team_jobs.profiles:transform --job-path /srv/team-repo --key member_id \\
        --pipeline profiles --version 3 --rules <run dir>/rules/titles/v2.toml ...

Before Spark starts, the job's function is imported (`jobs.lib.contract.api.load_job`), the rules file
(the rules stored with the version, written to its run dir by the launcher) is loaded and validated,
and kappa's own options are checked: any failure ends the process with one line, status failed,
exit 1, nothing written. Then the runtime (`jobs.lib.runtime`) starts the session; the function is
called with the `JobInput` when the query starts, and what it returns is checked before any batch
runs.

kappa's options (``[pipelines.<name>.options]``, passed as ``--extra``) are ``key_order``
(``partition``: refuse a key seen in two partitions; ``timestamp``: order by record timestamp, then
partition, offset), ``backfill`` (``one-batch`` or ``capped``), ``source_options`` (options of Spark's
Kafka source, or ``kafka.*`` client settings), ``upkeep`` (`jobs.lib.sink.upkeep`) and ``state_partitions``
(`jobs.lib.runtime.seedjob.state_partitions`); every other option is the job's own, in ``job.options``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from jobs.lib.contract.api import DELETED, ERROR, SOURCE_COLUMNS, JobInput, Upserts, check_result, load_job
from jobs.lib.runtime.args import parse_args
from jobs.lib.runtime.context import JobContext
from jobs.lib.runtime.loop import run
from jobs.lib.runtime.status import RunState, Status, summarize_error
from jobs.lib.runtime.stream import BACKFILL_MODES, KafkaWarmUp, check_source_options, kafka_reader, start_stream
from jobs.lib.sink.batches import MicroBatches, Prepared
from jobs.lib.sink.tables import KEY_ORDERS, MAX_CONFLICTS, DeltaTables, key_order_columns
from jobs.lib.sink.upkeep import Upkeep
from jobs.lib.source.json_values import PENDING, deferring
from orchestrator.core.exceptions import ConfigError, ContractError, KappaError
from orchestrator.core.jobref import KAPPA_OPTIONS
from orchestrator.core.paths import app_id

__all__ = ["REJECT_COLUMNS", "kappa_options", "output_columns", "group_batch", "batch_counts",
           "batch_rejects", "batch_latest", "split_batch", "reads_twice", "pending_records", "combine_latest",
           "merge_pending", "deferral_holds", "Grouped", "group_micro_batch", "UpsertBatches",
           "start_query", "start_job", "main"]

log = logging.getLogger("kappa.job")

REJECT_COLUMNS = ["key", "value", "topic", "partition", "offset", "error", "batch_id"]
POSITION = {"partition": "source_partition", "offset": "source_offset", "timestamp": "source_timestamp"}


def kappa_options(extra: dict | None) -> dict:
    """kappa's own options, checked (ConfigError naming the bad one); returns the job's options."""
    extra = dict(extra or {})
    order = str(extra.get("key_order", "partition"))
    if order not in KEY_ORDERS:
        raise ConfigError(f"--extra: key_order must be one of {', '.join(KEY_ORDERS)}, got {order!r}")
    backfill = str(extra.get("backfill", "one-batch"))
    if backfill not in BACKFILL_MODES:
        raise ConfigError(f"--extra: backfill must be one of {', '.join(BACKFILL_MODES)}, got {backfill!r}")
    source = extra.get("source_options") or {}
    if not isinstance(source, dict):
        raise ConfigError(f"--extra: source_options must be a table of options, got {source!r}")
    check_source_options(source)
    Upkeep.from_options([], extra.get("upkeep"))
    from jobs.lib.runtime.seedjob import state_partitions

    state_partitions(extra, "")
    return {k: v for k, v in extra.items() if k not in KAPPA_OPTIONS}


def output_columns(rows: Any) -> list[str]:
    """The output columns of an `Upserts` job's rows: all but the source's and kappa's."""
    return [c for c in rows.columns if c not in (*SOURCE_COLUMNS, ERROR, DELETED, "timestampType")]


#: One row per key (and per distinct reject) of a micro-batch (`group_batch`): its latest valid row,
#: whether its valid rows came from more than one partition, its rejects, and how many records it had.
LATEST, MOVED, REJECTS, RECORDS = "__latest", "__moved", "__rejects", "__records"
_REJECT = "__reject"
#: The key order's columns as the source names them (`jobs.lib.sink.tables.key_order_columns`).
SOURCE_ORDER = ("timestamp", "partition", "offset")


def group_batch(b: Any, output: list[str], key: str, key_order: str) -> Any:
    """One micro-batch of an `Upserts` job's rows -> one row per key and per distinct reject (`LATEST`,
    `MOVED`, `REJECTS`, `RECORDS`), in ONE aggregation: the batch is read and parsed once, and the rejects
    (few) ride along with the latest rows instead of costing a second pass or a persisted copy of every
    record.

    The latest row is the last valid one by the key order (within a Kafka partition the higher
    offset; under ``timestamp``, record timestamp, then partition, then offset): its output columns,
    the source position and ``_deleted``. A key with only rejects has none (it stays as it was). Each
    reject is a group of its own (the key and the reject are the grouping), its `REJECTS` the reject as
    many times as the batch holds it; a key's valid rows are one group, its `REJECTS` empty. Grouped so,
    the aggregation has no list to build: a ``collect_list`` of the rejects made Spark plan an object
    hash aggregate, which fell back to sorting past 128 keys and kept a list buffer for every key
    (4.3 of 17 CPU-s over the 2M-record log of `kappa bench parse`)."""
    from jobs.lib.runtime.columns import built_once

    columns = tuple(b.columns)
    grouping, aggregates, answer = built_once(("group_batch", columns, tuple(output), key_order),
                                              lambda: _group_aggregates(columns, output, key_order))
    return b.groupBy(key, *grouping).agg(*aggregates).select(key, *answer)


def _group_aggregates(columns: tuple[str, ...], output: list[str], key_order: str) -> tuple[list, list, list]:
    """`group_batch`'s grouping (besides the key), aggregates and answer columns over a batch of `columns`
    (made once per Spark context: they are the same every micro-batch)."""
    from pyspark.sql import functions as F

    error = F.col(ERROR).cast("string") if ERROR in columns else F.lit(None).cast("string")
    valid = error.isNull()
    deleted = F.coalesce(F.col(DELETED).cast("boolean"), F.lit(False)) if DELETED in columns else F.lit(False)
    row = F.struct(*[F.col(c) for c in output], F.col("partition").cast("int").alias(POSITION["partition"]),
                   F.col("offset").cast("long").alias(POSITION["offset"]),
                   F.col("timestamp").alias(POSITION["timestamp"]), deleted.alias(DELETED))
    # the record as the source gave it, its reason last: a record the parse left to the exact parser
    # (`PENDING`) goes to the job's function again from here (`group_micro_batch`)
    kind = [F.col("timestampType").cast("int").alias("timestampType")] if "timestampType" in columns else []
    reject = F.struct(F.col("key").cast("binary").alias("key"), F.col("value").cast("binary").alias("value"),
                      F.col("topic").cast("string").alias("topic"), F.col("partition").cast("int").alias("partition"),
                      F.col("offset").cast("long").alias("offset"),
                      F.col("timestamp").cast("timestamp").alias("timestamp"), *kind, error.alias(ERROR))
    partition = F.when(valid, F.col("partition"))
    moved = (F.min(partition) != F.max(partition)) if key_order == "partition" else F.lit(False)
    order = F.struct(*key_order_columns("", key_order, SOURCE_ORDER))
    one = F.col(_REJECT)
    times = F.when(one.isNotNull(), F.col(RECORDS)).otherwise(F.lit(0)).cast("int")
    return ([F.when(~valid, reject).alias(_REJECT)],
            [F.max_by(F.when(valid, row), F.when(valid, order)).alias(LATEST),
             F.coalesce(moved, F.lit(False)).alias(MOVED),
             F.count(F.lit(1)).alias(RECORDS)],
            [LATEST, MOVED, F.array_repeat(one, times).alias(REJECTS), RECORDS])


def batch_counts(g: Any, key: str) -> tuple[int, int, int, list[str], int]:
    """(records, rejects, rows to write, up to `MAX_CONFLICTS` keys seen in two partitions, records left
    to the exact parser) of a `group_batch` result, in one Spark job."""
    from jobs.lib.runtime.columns import built_once

    def counts() -> list[Any]:
        from pyspark.sql import functions as F

        return [F.coalesce(F.sum(RECORDS), F.lit(0)), F.coalesce(F.sum(F.size(REJECTS)), F.lit(0)), F.count(LATEST),
                _moved_keys(key), F.coalesce(F.sum(F.when(_pending(), F.size(REJECTS))), F.lit(0))]
    r = g.agg(*built_once(("batch_counts", key), counts)).first()
    return int(r[0]), int(r[1]), int(r[2]), list(r[3] or []), int(r[4])


def _moved_keys(key: str) -> Any:
    """Up to `MAX_CONFLICTS` keys of groups whose valid rows came from two partitions (an aggregate)."""
    from pyspark.sql import functions as F

    return F.slice(F.collect_list(F.when(F.col(MOVED), F.col(key).cast("string"))), 1, MAX_CONFLICTS)


def _group_columns(key: str) -> list[str]:
    """The columns of a `group_batch` result."""
    return [key, LATEST, MOVED, REJECTS, RECORDS]


def _pending() -> Any:
    """True for a `group_batch` group of a record the parse left to the exact parser (`deferring`)."""
    from pyspark.sql import functions as F

    return F.exists(REJECTS, lambda r: r[ERROR] == F.lit(PENDING))


def pending_records(g: Any, columns: list[str]) -> Any:
    """The records a `group_batch` result holds as `PENDING`, as the source gave them (`columns`, the
    micro-batch's; a ``timestampType`` the job's rows did not keep is null)."""
    from pyspark.sql import functions as F

    r = g.where(_pending()).select(F.explode(REJECTS).alias("r"))
    fields = set(r.schema["r"].dataType.fieldNames())
    return r.select(*[F.col(f"r.{c}").alias(c) if c in fields else F.lit(None).cast("int").alias(c) for c in columns])


def combine_latest(g: Any, more: Any, key: str, key_order: str) -> Any:
    """The valid groups (those with a latest row) of two `group_batch` results over records of one
    micro-batch, no record in both -> one per key over both: its latest row the later of its two by the key
    order, its valid rows moved when either part's did or their latest rows are in different partitions
    (each part's valid rows are in its latest row's partition otherwise), its records summed, and `BEFORE`
    (whether `g` had one for the key)."""
    from pyspark.sql import functions as F

    latest = F.col(LATEST)
    order = F.struct(*key_order_columns(f"{LATEST}.", key_order,
                                        (POSITION["timestamp"], POSITION["partition"], POSITION["offset"])))
    moved = F.bool_or(MOVED)
    if key_order == "partition":
        part = latest[POSITION["partition"]]
        moved = moved | F.coalesce(F.min(part) != F.max(part), F.lit(False))
    cols = _group_columns(key)
    both = (g.where(latest.isNotNull()).select(*cols, F.lit(True).alias(BEFORE))
            .unionByName(more.where(latest.isNotNull()).select(*cols, F.lit(False).alias(BEFORE))))
    return (both.groupBy(key)
            .agg(F.max_by(latest, order).alias(LATEST), moved.alias(MOVED), F.first(REJECTS).alias(REJECTS),
                 F.sum(RECORDS).cast("long").alias(RECORDS), F.bool_or(BEFORE).alias(BEFORE))
            .select(*cols, BEFORE))


#: Whether a key had a latest row before the pending records' (`combine_latest`).
BEFORE = "__before"
#: Up to this many pending records, their keys are broadcast to split the batch's groups (`merge_pending`).
BROADCAST_PENDING = 200_000


def merge_pending(g: Any, counts: tuple, more: Any, key: str, key_order: str, *,
                  broadcast: bool = True) -> tuple[Any, Any, tuple, Any]:
    """A micro-batch's groups `g` (many; `counts`, its `batch_counts`) with their pending ones, and the
    groups `more` of those records read exactly -> (the groups to take the latest rows from, those to take
    the rejects from, the counts of both, the combined groups, persisted). Only the keys of `more`'s latest
    rows are aggregated again (`combine_latest`, a semi join on them, broadcast when `broadcast`); the rest
    of `g` passes as it is, without a shuffle, and the rejects need no join: no record is in both."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    rest = g.where(~_pending())
    keys = more.where(F.col(LATEST).isNotNull()).select(F.col(key).alias("__key")).distinct()
    keys = F.broadcast(keys) if broadcast else keys
    on = F.col(key).eqNullSafe(F.col("__key"))   # a job's key may be null: group_batch groups it so
    touched = combine_latest(rest.join(keys, on, "left_semi"), more, key, key_order)
    touched = touched.persist(StorageLevel.MEMORY_AND_DISK)   # counted here, then read by the write
    cols = _group_columns(key)
    more_in, more_rejects, _, more_conflicts, more_pending = batch_counts(more, key)
    r = touched.agg(F.count(F.lit(1)), F.count_if(F.col(BEFORE)), _moved_keys(key)).first()
    rows_in, rejects, rows_out, conflicts, pending = counts
    merged = (rows_in - pending + more_in, rejects - pending + more_rejects, rows_out - int(r[1]) + int(r[0]),
              list(dict.fromkeys([*conflicts, *more_conflicts, *(r[2] or [])]))[:MAX_CONFLICTS], more_pending)
    return (rest.join(keys, on, "left_anti").select(*cols).unionByName(touched.select(*cols)),
            rest.select(*cols).unionByName(more.select(*cols)), merged, touched)


def deferral_holds(rows: Any, batch: Any, errors: list[int]) -> bool:
    """Whether a job's rows keep every record its one parse left to the exact parser, as `PENDING`: the
    rows' ``error`` is that parse's column (the same expression id), and between the parse and the rows
    there are only projections (no filter, join, union or aggregate that could drop, merge or repeat a
    record). A ``timestampType`` the rows do not keep must be one the job never reads (the runner gives
    the job's function those records again without it)."""
    if len(errors) != 1:
        return False
    plan = rows._jdf.queryExecution().analyzed()
    if _output_id(plan, ERROR) != errors[0]:
        return False
    node = plan
    while True:
        kind = node.nodeName()
        if kind == "Project" and _produces(node, errors[0]):
            break
        if kind not in ("Project", "SubqueryAlias") or node.children().size() != 1:
            return False
        node = node.children().apply(0)
    if "timestampType" in rows.columns or "timestampType" not in batch.columns:
        return True
    kind_id = _output_id(batch._jdf.queryExecution().analyzed(), "timestampType")
    return not _references(plan, kind_id)


def _output_id(plan: Any, name: str) -> int | None:
    out = plan.output()
    return next((out.apply(i).exprId().id() for i in range(out.size()) if out.apply(i).name() == name), None)


def _produces(project: Any, expr_id: int) -> bool:
    """Whether `project` makes the column `expr_id` (an alias), rather than passing it through."""
    exprs = project.projectList()
    return any(exprs.apply(i).getClass().getSimpleName() == "Alias" and exprs.apply(i).exprId().id() == expr_id
               for i in range(exprs.size()))


def _references(plan: Any, expr_id: int) -> bool:
    refs = plan.references().toSeq()
    if any(refs.apply(i).exprId().id() == expr_id for i in range(refs.size())):
        return True
    kids = plan.children()
    return any(_references(kids.apply(i), expr_id) for i in range(kids.size()))


def batch_rejects(g: Any) -> Any:
    """The rejects of a `group_batch` result, in the rejects table's columns but the batch id."""
    from pyspark.sql import functions as F

    return g.select(F.explode(REJECTS).alias("r")).select(*[f"r.{c}" for c in REJECT_COLUMNS if c != "batch_id"])


def batch_latest(g: Any, key: str, then: Callable | None) -> Any:
    """The latest row of each key of a `group_batch` result, after the job's ``then``, kappa's columns last."""
    latest = g.where(g[LATEST].isNotNull()).select(f"{LATEST}.*")
    kappa = [*POSITION.values(), DELETED]
    if then is not None:
        latest = then(latest)
        missing = [c for c in (key, *kappa) if c not in latest.columns]
        if missing:
            raise ContractError(f"the job's then() dropped {', '.join(missing)}; keep every column it is given "
                                f"and add or replace others")
    return latest.select(*[c for c in latest.columns if c not in kappa], *kappa)


def split_batch(b: Any, output: list[str], key: str, key_order: str, then: Callable | None) -> tuple[Any, Any]:
    """One micro-batch of an `Upserts` job's rows -> (rejects, in the rejects table's columns but the
    batch id; the latest row of each key by the key order, after ``then``, kappa's columns last)."""
    g = group_batch(b, output, key, key_order)
    return batch_rejects(g), batch_latest(g, key, then)


def reads_twice(rows: Any) -> bool:
    """Whether a job's plan reads its micro-batch more than once (a fast and a slow path, unioned)."""
    return rows._jdf.queryExecution().analyzed().toString().count("LogicalRDD") > 1


@dataclass
class Grouped:
    """A micro-batch through an `Upserts` job's function and `group_batch` (`group_micro_batch`)."""

    latest: Any            # `group_batch` groups to take the latest rows from (`batch_latest`)
    rejects: Any           # those to take the rejects from (`batch_rejects`): the same unless records were pending
    counts: tuple          # `batch_counts` of it
    held: list             # what was persisted for it, to unpersist after the batch
    then: Callable | None  # the job's step on the latest rows
    deferred: int | None   # records the parse left to the exact parser (None: the job's plan ran it itself)


def group_micro_batch(batch: Any, job_of: Callable[[Any], Upserts], output: list[str], key: str, key_order: str,
                      *, batch_id: int | None = None) -> Grouped:
    """One micro-batch -> its `group_batch` result, persisted, with the exact parser run over only the records
    the JVM could not vouch for: the job's function is called on the batch under `deferring`, those records
    ride the aggregation as `PENDING` rejects, then it is called again on them alone (its parse now exact),
    and their groups replace the pending ones (`merge_pending`). When the job's plan might lose or change a
    pending record (`deferral_holds`), the function is called again on the batch at once, the exact parser in
    its plan for every record (nothing was read yet). The batch is persisted only when the job's plan reads
    it twice (`reads_twice`), so that Kafka is read once."""
    from pyspark import StorageLevel

    with deferring() as parses:
        job = job_of(batch)
    deferred = bool(parses) and deferral_holds(job.rows, batch, parses)
    if parses and not deferred:
        job = job_of(batch)
    held = []
    if reads_twice(job.rows):
        held.append(batch.persist(StorageLevel.MEMORY_AND_DISK))
    g = group_batch(job.rows, output, key, key_order).persist(StorageLevel.MEMORY_AND_DISK)
    held.append(g)
    counts = batch_counts(g, key)
    pending = counts[4]
    latest = rejects = g
    if pending:
        exact = job_of(pending_records(g, batch.columns))
        more = group_batch(exact.rows, output, key, key_order).persist(StorageLevel.MEMORY_AND_DISK)
        held.append(more)
        latest, rejects, counts, touched = merge_pending(g, counts, more, key, key_order,
                                                         broadcast=pending <= BROADCAST_PENDING)
        held.append(touched)
        if counts[4]:
            where = "" if batch_id is None else f" of micro-batch {batch_id}"
            raise ContractError(f"{counts[4]} records{where} kept the error {PENDING!r} after the exact parser read "
                                f"them: a job's function must not give that error itself")
    return Grouped(latest=latest, rejects=rejects, counts=counts, held=held, then=job.then,
                   deferred=pending if deferred else None)


class UpsertBatches(MicroBatches):
    """The foreachBatch function of an `Upserts` job: one aggregation per batch gives the latest row
    per key (the key order), the rejects and the counts (`group_batch`); the rejects go to the rejects
    table, the latest rows through the job's ``then`` into the version's table (`jobs.lib.sink.tables`)."""

    def __init__(self, args: Any, key: str, key_order: str, output: list[str], job_of: Callable[[Any], Upserts],
                 rules_hash: str | None, on_batch: Callable[..., None] | None = None, name: str = "job"):
        metadata = {"pipeline": args.pipeline, "pipeline_version": str(args.version)}
        if rules_hash:
            metadata.update(rules_hash=rules_hash, rules_file=str(args.rules))
        tables = DeltaTables(args.output, args.rejects, app_id(args.pipeline, args.version), key,
                             key_order=key_order, checkpoint=str(args.checkpoint), metadata=metadata)
        super().__init__(args, tables, name=name, on_batch=on_batch, log=log)
        self.output, self.job_of = output, job_of

    def prepare(self, batch: Any, batch_id: int) -> Prepared:
        """The job's plan over the micro-batch, grouped by key once and kept (persisted): small, one row
        per key and per reject (`group_micro_batch`: the exact parser over only what the JVM left it)."""
        from pyspark.sql import functions as F

        grouped = group_micro_batch(batch, self.job_of, self.output, self.tables.key, self.tables.key_order,
                                    batch_id=batch_id)
        rows_in, n_rejects, rows_out, conflicts, _ = grouped.counts
        return Prepared(rows_in=rows_in, n_rejects=n_rejects, rows_out=rows_out,
                        output=batch_latest(grouped.latest, self.tables.key, grouped.then),
                        rejects=batch_rejects(grouped.rejects).withColumn("batch_id", F.lit(batch_id).cast("long")),
                        held=grouped.held, conflicts=conflicts)

    def check(self, batch_id: int, prepared: Prepared) -> None:
        """Under key order ``partition``, a key this batch holds in two partitions refuses the batch (a key
        the table holds from another partition is refused by the MERGE itself)."""
        if prepared.conflicts:
            self.tables.refuse(batch_id, [f"{k} (partitions of this micro-batch)" for k in prepared.conflicts])

    def write(self, batch_id: int, output: Any, rows: int) -> None:
        self.tables.upsert(batch_id, output, DELETED, rows=rows)


def _caller(spark: Any, args: Any, ref: str, fn: Callable[[JobInput], Any], rules: Any):
    """(the key columns, `call(read)`: the job's function on the stream `read()` gives, its result checked)."""
    key = tuple(k.strip() for k in (args.key or "").split(",") if k.strip())
    options = kappa_options(getattr(args, "extra", None))
    topics = tuple(getattr(args, "topics_list", None) or args.topics.split(","))

    def call(read: Callable[..., Any], streaming: bool = True) -> Any:
        job = JobInput(spark=spark, source=read(), read=read, options=options, rules=rules, key=key, topics=topics,
                       pipeline=args.pipeline, version=int(args.version))
        return check_result(ref, fn(job), key, streaming=streaming)
    return key, call


def batch_reader(batch: Any) -> Callable[..., Any]:
    """`read(topics=None)` over one micro-batch of the source: its records, or those of some topics."""
    from pyspark.sql import functions as F

    def read(topics: str | list[str] | None = None) -> Any:
        if topics is None:
            return batch
        return batch.where(F.col("topic").isin([topics] if isinstance(topics, str) else list(topics)))
    return read


def start_query(spark: Any, args: Any, ref: str, fn: Callable[[JobInput], Any], rules: Any, source_options: dict,
                trigger: dict, *, on_batch: Callable[..., None] | None = None,
                probe: Any = None) -> tuple[Any, UpsertBatches]:
    """Start an `Upserts` job's query on `spark` (the runtime's `start_job`, the benchmarks and the
    tests); returns (query, its foreachBatch function). `args` are the runtime's arguments; `probe`, what
    the job's function returned on the stream if the caller called it already (else it is called here)."""
    key, call = _caller(spark, args, ref, fn, rules)
    extra = dict(getattr(args, "extra", None) or {})
    if probe is None:
        probe = call(kafka_reader(spark, source_options))   # what the job returns decides the sink
    if not isinstance(probe, Upserts):
        raise ContractError(f"job {ref!r} returned Stateful: it runs through the runtime (start_job)")
    if len(key) != 1:
        raise ContractError(f"job {ref!r}: Upserts keep the latest row of one key column; the pipeline's key is "
                            f"{', '.join(key)} (make one key column, or return Stateful)")
    output = output_columns(probe.rows)
    name = ref.split(":")[0].rsplit(".", 1)[-1]
    # the query streams the source's records; each micro-batch, persisted once, is given to the job
    writer = UpsertBatches(args, key[0], str(extra.get("key_order", "partition")), output,
                           lambda batch: call(batch_reader(batch), streaming=False),
                           rules.content_hash if rules is not None else None, on_batch=on_batch, name=name)
    query = start_stream(spark, source_options, writer, checkpoint=str(args.checkpoint), trigger=trigger,
                         name=f"{name}_{args.pipeline}_v{args.version}", build=lambda read: read(),
                         backfill=str(extra.get("backfill", "one-batch")))
    return query, writer


def start_job(ctx: JobContext, ref: str, fn: Callable[[JobInput], Any], rules: Any = None) -> Any:
    """Start the version's query with the job's function (the runtime's `build(ctx)`); returns it."""
    from jobs.lib.runtime import seedjob

    if rules is not None:
        ctx.rules_hash = rules.content_hash
    key, call = _caller(ctx.spark, ctx.args, ref, fn, rules)
    options = ctx.kafka_options()
    KafkaWarmUp(ctx.spark, options).start()   # the query's first offsets request, on the other core
    # The job's function, once on the stream before the query starts: what it returns decides the sink.
    # (On a fresh JVM Spark analyses its plan slowly: a second call cost ~0.3 s of the query's start.)
    probe = call(kafka_reader(ctx.spark, options))
    if isinstance(probe, Upserts):
        query, writer = start_query(ctx.spark, ctx.args, ref, fn, rules, options, ctx.trigger_kwargs(),
                                    on_batch=ctx.record_batch, probe=probe)
        ctx.stage_timings = writer.timings
        return query
    name = ref.split(":")[0].rsplit(".", 1)[-1]
    return seedjob.start_stateful(ctx, ref, probe, call, key, name)


def _fail_before_start(args: argparse.Namespace, e: KappaError) -> None:
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    status = Status(run_dir / "status.json", args.pipeline, args.version, args.trigger)
    status.update(state=RunState.FAILED, error=summarize_error(e))
    print(f"job {args.pipeline} v{args.version} failed before starting: {summarize_error(e)}", flush=True)
    sys.exit(1)


def main(argv: list[str] | None = None, *, job: str | None = None, key: str | None = None) -> None:
    """`python -m jobs.run`: the job imported, the rules and options checked, before Spark starts.
    `job` and `key` are defaults of ``--job`` and ``--key`` (a job module's own ``__main__``)."""
    from jobs.lib.rules.files import load_rules

    argv = list(sys.argv[1:] if argv is None else argv)
    if job and "--job" not in argv:
        argv += ["--job", job]
    if key and "--key" not in argv:
        argv += ["--key", key]
    try:
        args = parse_args(argv)
    except Exception:
        return run(lambda ctx: None, argv)  # the runtime reports bad arguments its own way
    try:
        if not args.job or not args.key:
            raise ConfigError("python -m jobs.run needs --job MODULE:FUNCTION and --key COLUMNS")
        fn = load_job(args.job, [p for p in args.job_path.split(os.pathsep) if p])
        rules = load_rules(args.rules) if args.rules else None
        kappa_options(args.extra)
    except KappaError as e:
        _fail_before_start(args, e)
    run(lambda ctx: start_job(ctx, args.job, fn, rules), argv)
