"""What every kappa job does in foreachBatch around its own transformation. Runs on the driver.

For each micro-batch, in this order:

1. a batch the output table already holds (its Delta application transaction, checked against the
   end offsets it recorded, `jobs.lib.sink.tables.DeltaTables.committed`) is a replay after a crash: it is
   not written again (a stateful job still runs its plan into Spark's no-op sink, so that its state
   store commits the batch's version);
2. records the batch should read that the log no longer has (retention, DeleteRecords: see
   `jobs.lib.runtime.stream.lost_offsets`) fail it under ``failOnDataLoss``, else are logged;
3. the batch runs as one Spark job group; a version's first batch (its backfill) reports its read
   progress while it runs (`jobs.lib.runtime.backfill.BackfillProgress`), so lag moves;
4. the job's `prepare` computes its rejects and output rows (persisted, so a stateful plan runs once)
   and counts them; `check` may refuse the batch before anything is written; meanwhile, in a job
   process's first batch, a thread creates the rejects table empty if it is not there yet
   (`jobs.lib.sink.tables.DeltaTables.ensure_rejects`, `REJECTS_DDL`);
5. the rejects are appended, then the output written (`write`), each an idempotent Delta commit;
6. the counts go to the runtime's status (`on_batch`);
7. every so many batches, the tables' upkeep (`jobs.lib.sink.upkeep`: OPTIMIZE, VACUUM);
8. after the first small batch that is not a backfill (a live one), the JVM's JIT leaves C2 out from
   then on (`jobs.lib.runtime.session.leave_to_c1`): live batches are new generated code each time.

Test hooks (`jobs.lib.sink.tables`): ``KAPPA_TEST_PAUSE_AT=read:<id>`` / ``commit:<id>``,
``KAPPA_TEST_CRASH_AFTER_COMMIT=<id>``, and ``KAPPA_TEST_HOLD_BEFORE_COMMIT=<id>[,<id>...]`` with
``KAPPA_TEST_HOLD_FILE`` (the batch read, held before its commits until the file is deleted; several
ids hold each of those batches of one job process in turn, the file written again for each).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from jobs.lib.runtime.backfill import BackfillProgress, initial_offsets
from jobs.lib.runtime.session import leave_to_c1, session_settings
from jobs.lib.runtime.stream import fail_on_data_loss, lost_offsets, needs_backfill
from jobs.lib.sink.tables import REJECTS_DDL, DeltaTables, batch_end_offsets, crash_if_asked, pause_if_asked
from jobs.lib.sink.upkeep import Upkeep
from orchestrator.core.exceptions import SourceError

__all__ = ["Prepared", "MicroBatches", "batch_start_offsets", "hold_if_asked", "HOLD_HOOK", "HOLD_FILE"]

HOLD_HOOK = "KAPPA_TEST_HOLD_BEFORE_COMMIT"
#: A batch of at most this many records (its offset range) is small: one shuffle partition.
SMALL_BATCH_RECORDS = 10_000
_SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
HOLD_FILE = "KAPPA_TEST_HOLD_FILE"


def hold_if_asked(batch_id: int, log: logging.Logger | None = None) -> None:
    """The hold hook (see the module): hold this batch before its commits while the file exists."""
    ids = {i.strip() for i in os.environ.get(HOLD_HOOK, "").split(",")}
    if str(batch_id) not in ids or not os.environ.get(HOLD_FILE):
        return
    path = os.environ[HOLD_FILE]
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")
    (log or logging.getLogger("kappa.batches")).warning(
        "%s=%s: micro-batch %d read, holding it before its commits until %s is deleted", HOLD_HOOK,
        batch_id, batch_id, path)
    while os.path.exists(path):
        time.sleep(0.05)


def batch_start_offsets(checkpoint: str, batch_id: int) -> dict | None:
    """Where micro-batch `batch_id` starts: the previous batch's end offsets, or the offsets the
    query started from (batch 0, or a partition new since the previous batch: its log start)."""
    start: dict[str, dict[str, int]] = {}
    for (topic, p), o in (initial_offsets(checkpoint) or {}).items():
        start.setdefault(topic, {})[str(p)] = o
    previous = batch_end_offsets(checkpoint, batch_id - 1) if batch_id > 0 else None
    for topic, parts in (previous or {}).items():
        start.setdefault(topic, {}).update(parts)
    return start or None


@dataclass
class Prepared:
    """One micro-batch's results, lazy DataFrames over persisted data, and their counts."""

    rows_in: int          # source records read
    rejects: Any          # the rejects table's columns (with batch_id)
    n_rejects: int
    output: Any           # what `write` writes
    rows_out: int
    held: list            # persisted DataFrames, unpersisted after the batch
    conflicts: list = field(default_factory=list)   # what `check` refuses the batch for, found by `prepare`


class RejectsTable:
    """The rejects table created empty (`DeltaTables.ensure_rejects`) on a thread of its own while the
    batch is read; `wait` re-raises what the create raised."""

    def __init__(self, tables: DeltaTables, spark: Any, ddl: str, group: str, description: str):
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(tables, spark, ddl, group, description),
                                       name="kappa-rejects-table", daemon=True)
        self.thread.start()

    def _run(self, tables: DeltaTables, spark: Any, ddl: str, group: str, description: str) -> None:
        from pyspark.sql.types import StructType

        try:
            spark.sparkContext.setJobGroup(group, description)   # the batch's: counted and cancelled with it
            tables.ensure_rejects(spark, StructType.fromDDL(ddl))
        except BaseException as e:  # noqa: BLE001 - handed to the batch's thread, which raises it
            self.error = e

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


class MicroBatches:
    """The foreachBatch function of a job: subclasses say how a batch becomes rejects and output
    (`prepare`), what refuses it (`check`) and how its output is written (`write`)."""

    #: A stateful plan (aggregation, join state) must run even for a batch already written.
    stateful = False

    def __init__(self, args: Any, tables: DeltaTables, *, name: str,
                 on_batch: Callable[..., None] | None = None, log: logging.Logger | None = None):
        self.tables = tables
        self.name = name
        self.on_batch = on_batch
        self.log = log or logging.getLogger(f"kappa.{name}")
        self.checkpoint = str(args.checkpoint)
        self.bootstrap_servers = getattr(args, "bootstrap_servers", None)
        self.kafka_config = getattr(args, "kafka_config", None)
        extra = getattr(args, "extra", None) or {}
        self.fail_on_data_loss = fail_on_data_loss(extra.get("source_options") or {})
        self.upkeep = Upkeep.from_options([tables.table_uri, tables.rejects_uri], extra.get("upkeep"), self.log)
        self.skipped: list[int] = []
        self.known_through: int | None = None      # batches up to this one are known to be in the output table
        self.timings: list[dict[str, float]] = []
        self.rejects_total: int | None = None

    # -- what a job says ----------------------------------------------------------------------------
    def prepare(self, batch: Any, batch_id: int) -> Prepared:
        raise NotImplementedError

    def check(self, batch_id: int, prepared: Prepared) -> None:
        """Refuse the batch (raise) before anything of it is written; nothing by default."""

    def write(self, batch_id: int, output: Any, rows: int) -> None:
        """Write `output` (`rows` rows) to the version's table."""
        raise NotImplementedError

    # -- the plumbing -------------------------------------------------------------------------------
    def _check_data_loss(self, batch_id: int) -> None:
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
        self.log.warning("micro-batch %d: records lost before the version read them (failOnDataLoss=false, "
                         "going on): %s", batch_id, "; ".join(lost))

    def _committed(self, batch_id: int) -> bool:
        """Whether the output table holds `batch_id` already. Read from the table once per process: after
        that, this process is the version's only writer (its lease), so a batch after the last one it
        wrote is new, and the table's log is not read again for it. A write that did not return (an
        error mid-write) leaves it unknown, and the next batch reads the table again."""
        if self.known_through is not None and batch_id > self.known_through:
            return False
        done = self.tables.committed(batch_id)
        self.known_through = batch_id if done else batch_id - 1
        return done

    def _planned_records(self, batch_id: int, end: dict | None) -> int | None:
        """The records the batch's offset range holds at most (compaction gaps make it fewer)."""
        start = batch_start_offsets(self.checkpoint, batch_id)
        if not start or not end:
            return None
        return sum(max(0, int(o) - int(start.get(t, {}).get(p, 0))) for t, parts in end.items() for p, o in parts.items())

    def _sized(self, spark: Any, planned: int | None):
        """A small batch (a live one) shuffles into one partition: a task per partition costs more than
        its rows. The backfill keeps the session's partitions (the cores)."""
        if planned is None or planned > SMALL_BATCH_RECORDS:
            return contextlib.nullcontext()
        return session_settings(spark, {_SHUFFLE_PARTITIONS: "1"})

    def __call__(self, batch: Any, batch_id: int) -> None:
        if self._committed(batch_id):
            self.log.warning("micro-batch %d is in %s already (app transaction %s): not written again "
                             "(a replay after a restart)", batch_id, self.tables.table_uri, self.tables.app_id)
            if self.stateful:
                batch.write.format("noop").mode("overwrite").save()
            self.skipped.append(batch_id)
            return
        self._check_data_loss(batch_id)
        t0 = time.perf_counter()
        spark = batch.sparkSession
        group = f"kappa-{self.tables.app_id}-batch-{batch_id}"
        description = f"kappa {self.name}: micro-batch {batch_id}"
        spark.sparkContext.setJobGroup(group, description)
        progress: Any = contextlib.nullcontext()
        end = batch_end_offsets(self.checkpoint, batch_id)
        backfill = needs_backfill(self.checkpoint)   # the version's first pass: its measure goes to the status
        if backfill and end:
            progress = BackfillProgress(spark, self.checkpoint, group, end)   # lag moves while batch 0 is read
        planned = self._planned_records(batch_id, end)
        held: list = []
        rejects_table = None
        if self.tables.rejects_uri is not None and not self.tables.rejects_found:
            rejects_table = RejectsTable(self.tables, spark, REJECTS_DDL, group, description)
        try:
            with progress, self._sized(spark, planned):
                try:
                    p = self.prepare(batch, batch_id)
                except BaseException:
                    if rejects_table is not None:
                        rejects_table.thread.join()   # the batch's own error is the one to raise
                    raise
                if rejects_table is not None:
                    rejects_table.wait()
                held = p.held
                if isinstance(progress, BackfillProgress):
                    progress.read()
                t1 = time.perf_counter()
                self.check(batch_id, p)
                pause_if_asked("read", batch_id)
                hold_if_asked(batch_id, self.log)
                self.tables.write_rejects(batch_id, p.rejects, p.n_rejects)
                t2 = time.perf_counter()
                pause_if_asked("commit", batch_id)
                self.known_through = None          # unknown until the write returns: a retry reads the table
                self.write(batch_id, p.output, p.rows_out)
                self.known_through = batch_id
                t3 = time.perf_counter()
        finally:
            for df in held:
                df.unpersist()
        crash_if_asked(batch_id)
        self.upkeep.after_batch(spark)
        if not backfill and planned is not None and planned <= SMALL_BATCH_RECORDS:
            settled = leave_to_c1(spark)
            if settled:
                self.log.info("micro-batch %d was a live one (%d records at most): %s", batch_id, planned, settled)
        jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))
        self.timings.append({"batch_id": batch_id, "read_transform_count": t1 - t0, "rejects": t2 - t1,
                             "write": t3 - t2, "upkeep": time.perf_counter() - t3, "spark_jobs": jobs})
        if backfill:   # what the next version's backfill estimate is measured from (`JobContext.record_batch`)
            self.timings[-1]["backfill"] = {"offsets": planned, "end_offsets": end}
        self.log.info("micro-batch %d: %d records, %d rows written, %d rejects, %d Spark jobs (%.2f s: read and "
                      "transform %.2f, rejects %.2f, write %.2f)", batch_id, p.rows_in, p.rows_out, p.n_rejects, jobs,
                      t3 - t0, t1 - t0, t2 - t1, t3 - t2)
        if self.on_batch is not None:
            if self.rejects_total is None:   # counted once (a restart), then kept up to date
                from orchestrator.core.tables import count_rows
                self.rejects_total = count_rows(self.tables.rejects_uri) if self.tables.rejects_uri else 0
            else:
                self.rejects_total += p.n_rejects
            self.on_batch(batch_id, p.rows_in, p.rows_out, p.n_rejects, self.rejects_total, timing=self.timings[-1])
