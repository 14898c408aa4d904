"""`UpsertBatches`: the foreachBatch function of a keyed upsert job whose records stay on executors.

Runs on the driver, once per micro-batch of a ``kappa_kafka_ranges`` query (`jobs.lib.kafka.ranges`):

1. the batch's rows, its offset ranges: planned on the driver from the offsets Spark logged in the
   checkpoint (`jobs.lib.kafka.ranges.logged_rows`: the same function as the source's), or, when
   they cannot be known from there, collected from the batch (a few dozen rows, one tiny task);
2. if the table already holds this batch id with these end offsets, skip it (a replay after a
   crash); with other offsets, refuse (`BucketedTable.check_replay`);
3. stage: one Spark task per range reads, transforms and stages its rows by bucket
   (`tasks.stage_piece`). While they run, a watcher thread reports every second how many of the
   batch's records have been read (`on_read`: the finished tasks' share), so a one-batch backfill
   shows progress; the consumer group's offsets and the Spark checkpoint still mean "committed to
   the table", and move when the batch commits. The backfill (batch 0 of a query whose source
   reads it as one batch, with ``progress`` set: ``<checkpoint>/kappa-read-progress``) also reports
   its read progress where the orchestrator's lag reads it (`jobs.lib.kafka.progress`): the driver
   writes the manifest of the batch's bounds (`batch_bounds`), each task the offset it has read up
   to, and the driver drops it once Spark committed the batch to its checkpoint (`clear_when_committed`);
4. merge: the touched buckets dealt to a few Spark tasks (`tasks.merge_bucket` per bucket);
5. commit the rejects (their own idempotent Delta commit), then the output: one Delta
   transaction with adds, removes, app transaction and end offsets;
7. drop the batch's staging files, and table upkeep when due.

Test hooks, so that tests force their interleaving instead of racing it:
``KAPPA_TEST_HOLD_BEFORE_COMMIT=<batch id>`` with ``KAPPA_TEST_HOLD_FILE=<path>`` (the seed jobs'
hook, `jobs.lib.seedjob.hold_if_asked`): that batch is read, transformed and merged, then the job
writes the file and waits, before any Delta commit, until the test deletes it.
``KAPPA_TEST_CRASH_AFTER_COMMIT=<batch id>``: the process dies (exit 137, no clean-up) right after
that batch's output commit, before Spark commits the batch to its checkpoint.
``KAPPA_TEST_PAUSE_AT=<point>:<batch id>`` with ``KAPPA_TEST_PAUSE_FILE=<path>``: at ``read`` (the
batch's first two read tasks finish, the others wait in their workers) or ``commit`` (every data
file of the batch written, before its commits) the job writes the file and waits there for ever,
for the test to kill it with SIGKILL.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import replace
from functools import partial
from typing import Any, Callable

from jobs.lib.bucketed.table import BucketedTable
from jobs.lib.bucketed.tasks import StageSpec, merge_bucket, stage_piece, staged_path
from jobs.lib.kafka.checkpoint import last_committed_batch
from jobs.lib.kafka.progress import backfill_reading, clear as clear_progress, source_dir, write_manifest
from orchestrator.core.exceptions import SinkError

__all__ = ["CRASH_HOOK", "PAUSE_HOOK", "PAUSE_FILE", "UpsertBatches", "end_offsets_of", "merge_groups",
           "batch_bounds", "clear_when_committed"]

log = logging.getLogger("kappa.upsert")

CRASH_HOOK = "KAPPA_TEST_CRASH_AFTER_COMMIT"
WATCH_SECONDS = 1.0
PAUSE_HOOK = "KAPPA_TEST_PAUSE_AT"
PAUSE_FILE = "KAPPA_TEST_PAUSE_FILE"


def _pause_if_asked(point: str, batch_id: int, block: bool = True) -> None:
    """The test hook (see the module): stop here for ever if the environment asks for it."""
    want = os.environ.get(PAUSE_HOOK)
    if not want or want != f"{point}:{batch_id}":
        return
    path = os.environ.get(PAUSE_FILE)
    log.error("%s=%s: pausing at %s of micro-batch %d until killed", PAUSE_HOOK, want, point, batch_id)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
    while block:
        time.sleep(3600)


def batch_bounds(rows: list[tuple]) -> tuple[dict, dict]:
    """(start, end) offsets per (topic, partition) of a batch's range rows: the lowest start and the
    highest end of each partition's ranges, the bounds of the batch for its progress manifest."""
    start: dict[tuple[str, int], int] = {}
    end: dict[tuple[str, int], int] = {}
    for topic, partition, s, e, _new in rows:
        tp = (str(topic), int(partition))
        start[tp] = min(int(s), start.get(tp, int(s)))
        end[tp] = max(int(e), end.get(tp, int(e)))
    return start, end


def clear_when_committed(where: str, checkpoint: str, batch_id: int, *, poll: float = 0.2,
                         timeout: float = 600.0) -> threading.Thread:
    """Drop the read progress in ``where`` once Spark committed ``batch_id`` to the checkpoint (it
    does right after foreachBatch returns; dropping it before would show the version's lag back at
    the log start meanwhile). A daemon thread; the files of a run that dies first are dropped when
    the next run starts, and mean nothing once a batch is committed."""
    def wait() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = last_committed_batch(checkpoint)
            if done is not None and done >= batch_id:
                clear_progress(where)
                return
            time.sleep(poll)
        log.debug("micro-batch %d not committed to %s within %.0fs: its read progress stays", batch_id,
                  checkpoint, timeout)

    t = threading.Thread(target=wait, name="kappa-read-progress-clear", daemon=True)
    t.start()
    return t


def end_offsets_of(rows: list[tuple]) -> dict:
    """Offset JSON of a batch's range rows: the highest end per partition."""
    out: dict[str, dict[str, int]] = {}
    for topic, partition, _start, end, _new in rows:
        parts = out.setdefault(str(topic), {})
        parts[str(partition)] = max(int(end), parts.get(str(partition), 0))
    return out


class UpsertBatches:
    """The foreachBatch callable (see the module). `transform(records, batch_id)` runs in tasks."""

    def __init__(self, table: BucketedTable, settings: Any, transform: Callable, key_column: str, *,
                 key_order: str = "partition", on_batch: Callable[..., None] | None = None,
                 on_read: Callable[[int, int, int], None] | None = None, crash_after: int | None = None,
                 checkpoint: str | None = None, task_records: int | None = None, progress: str | None = None):
        self.table = table
        self.settings = settings
        self.transform = transform
        self.key_column = key_column
        self.key_order = key_order
        self.on_batch = on_batch
        self.on_read = on_read
        self.crash_after = crash_after
        self.checkpoint = str(checkpoint) if checkpoint is not None and task_records else None
        self.task_records = task_records
        self.progress = progress   # `jobs.lib.kafka.progress.progress_dir` of the checkpoint; None: no report
        self.skipped: list[int] = []
        self.timings: list[dict] = []
        self.rejects_total: int | None = None

    def __call__(self, df: Any, batch_id: int) -> None:
        entered = time.perf_counter()
        if self.rejects_total is None:
            self.table.ensure()
            self.rejects_total = _count(self.table.rejects_uri)
        ready = time.perf_counter()
        rows = self._rows(df, batch_id)
        collected = time.perf_counter()
        end = end_offsets_of(rows)
        if self.table.check_replay(batch_id, end):
            log.warning("micro-batch %d is already in %s with the same end offsets (app transaction %s): skipped "
                        "(replay after a restart)", batch_id, self.table.table_uri, self.table.app_id)
            self.skipped.append(batch_id)
            if self.progress and batch_id == 0:   # a dead run's reports: this batch is in the table
                clear_progress(source_dir(self.progress, self.settings.topics))
            if self.on_batch:
                self.on_batch(batch_id, 0, 0, 0, self.rejects_total)
            return
        sc = df.sparkSession.sparkContext
        pieces = [r for r in rows if r[3] > r[2]]
        reporting = self._report_to(batch_id, rows, pieces)
        spec = StageSpec(table_uri=self.table.table_uri, rejects_uri=self.table.rejects_uri,
                         staging_uri=f"{self.table.staging_root}/batch-{batch_id}", batch_id=batch_id,
                         buckets=self.table.buckets, key_column=self.key_column, settings=self.settings,
                         transform=self.transform, output_schema=self.table.schema, key_order=self.key_order,
                         hold_from=2 if os.environ.get(PAUSE_HOOK) == f"read:{batch_id}" else None,
                         progress=reporting)
        t0 = time.perf_counter()
        staged = self._stage(sc, spec, pieces, batch_id)
        t1 = time.perf_counter()
        by_bucket: dict[int, list[str]] = {}
        for s in staged:
            for b in s["staged"]:
                by_bucket.setdefault(int(b), []).append(
                    staged_path(spec.staging_uri, int(b), s["topic"], s["partition"], s["start"]))
        current = self.table.current_files(set(by_bucket))
        work = [(b, by_bucket[b], current[b]) for b in sorted(by_bucket)]
        t2 = time.perf_counter()
        merged: list[dict] = []
        groups: list[list[tuple]] = []
        if work:
            sc.setJobDescription(f"kappa merge: micro-batch {batch_id}, {len(work)} buckets")
            slim = replace(spec, transform=None, settings=None, progress=None)   # merge tasks need neither: keep them small
            groups = merge_groups(work, 2 * max(1, int(sc.defaultParallelism)))
            merged = [m for ms in sc.parallelize(groups, len(groups)).map(partial(_merge_all, slim)).collect()
                      for m in ms]
        conflicts = [c for m in merged for c in m["conflicts"]]
        if conflicts:
            self.table.drop_staging(spec.staging_uri)
            raise SinkError(
                f"micro-batch {batch_id}: key(s) found in more than one Kafka partition, whose order Kafka does not "
                f"define: {', '.join(conflicts[:5])}. Fix the producers' partitioner, or set key_order = \"timestamp\" "
                f"in the pipeline's options to order such records by timestamp, then partition, then offset")
        t3 = time.perf_counter()
        _pause_if_asked("commit", batch_id)
        from jobs.lib.seedjob import hold_if_asked

        hold_if_asked(batch_id, log)
        new_rejects = self.table.commit_rejects(batch_id, [s["reject_add"] for s in staged if s["reject_add"]])
        adds = [m["add"] for m in merged if m["add"]]
        removes = [r for m in merged for r in m["remove"]]
        version = self.table.commit(batch_id, adds, removes, end)
        t4 = time.perf_counter()
        if reporting:
            clear_when_committed(reporting, os.path.dirname(self.progress), batch_id)
        if self.crash_after is not None and batch_id >= self.crash_after:
            log.error("%s=%s: dying after the Delta commit of micro-batch %d, before Spark's checkpoint commit",
                      CRASH_HOOK, self.crash_after, batch_id)
            logging.shutdown()
            os._exit(137)
        self.table.drop_staging(spec.staging_uri)
        self.table.upkeep()
        rows_in = sum(s["rows_in"] for s in staged)
        keys = sum(s["keys"] for s in staged)
        tombstones = sum(s["tombstones"] for s in staged)
        rejects = sum(s["rejects"] for s in staged)
        self.rejects_total += new_rejects
        task_seconds: dict[str, float] = {}
        for s in staged:
            for k, v in s["seconds"].items():
                task_seconds[k] = task_seconds.get(k, 0.0) + v
        rewritten = sum(m.get("rewritten_bytes", 0) for m in merged)
        self.timings.append({"batch_id": batch_id, "rows_in": rows_in, "entered": entered, "left": t4,
                             "plan": t0 - entered, "plan_tables": ready - entered, "plan_collect": collected - ready, "stage": t1 - t0, "list_files": t2 - t1, "merge": t3 - t2,
                             "commit": t4 - t3, "tasks": len(pieces), "buckets": len(work),
                             "merge_tasks": len(groups) if work else 0,
                             "rewritten_bytes": rewritten,
                             **{f"tasks_{k}": v for k, v in task_seconds.items()}})
        log.info("micro-batch %d: %d records in %d tasks, %d keys (%d tombstones), %d rejects; %d buckets rewritten "
                 "(%d bytes replaced); stage %.2fs, merge %.2fs, commit %.2fs -> table version %d", batch_id, rows_in,
                 len(pieces), keys, tombstones, rejects, len(work), rewritten, t1 - t0, t3 - t2, t4 - t3, version)
        if self.on_batch:
            self.on_batch(batch_id, rows_in, keys, rejects, self.rejects_total)

    def _report_to(self, batch_id: int, rows: list[tuple], pieces: list[tuple]) -> str | None:
        """Where the tasks of this batch report their read progress, its manifest written: the
        backfill's (batch 0 of a one-batch backfill) only; None for other batches."""
        if (not self.progress or batch_id != 0 or not pieces
                or getattr(self.settings, "backfill", "one-batch") != "one-batch"):
            return None
        where = source_dir(self.progress, self.settings.topics)
        start, end = batch_bounds(rows)
        write_manifest(where, start, end, 1)   # one scan; drops a dead run's reports first
        return where

    def _rows(self, df: Any, batch_id: int) -> list[tuple]:
        """The batch's range rows: planned here from the offsets Spark logged in the checkpoint
        when it can be (no Spark job), else collected from the batch (one tiny task)."""
        if self.checkpoint is not None:
            from jobs.lib.kafka.ranges import logged_rows

            rows = logged_rows(self.checkpoint, batch_id, self.settings, self.task_records)
            if rows is not None:
                return rows
        return [tuple(r) for r in df.collect()]

    def _stage(self, sc: Any, spec: StageSpec, pieces: list[tuple], batch_id: int) -> list[dict]:
        """One Spark job of read-transform-stage tasks; a watcher thread reports read progress."""
        if not pieces:
            return []
        group = f"kappa-stage-{batch_id}-{spec.nonce}"
        sc.setJobGroup(group, f"kappa read+transform: micro-batch {batch_id}, {len(pieces)} ranges")
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(sc, group, pieces, batch_id, stop, spec.progress),
                                   name="kappa-read-progress", daemon=True)
        watcher.start()
        try:
            return sc.parallelize(list(enumerate(pieces)), len(pieces)).map(partial(stage_piece, spec)).collect()
        finally:
            stop.set()
            watcher.join(10)
            sc.setJobGroup("kappa", "kappa")

    def _watch(self, sc: Any, group: str, pieces: list[tuple], batch_id: int, stop: threading.Event,
               reporting: str | None = None) -> None:
        """Every second while the stage job runs: records read so far (the finished tasks' share,
        ranges being about equal; for a reporting backfill, what its tasks reported) to `on_read`,
        and the `read` pause hook once a task finished."""
        total = sum(p[3] - p[2] for p in pieces)
        reported = -1
        while not stop.wait(WATCH_SECONDS):
            try:
                tracker = sc.statusTracker()
                finished = 0
                for job in tracker.getJobIdsForGroup(group):
                    info = tracker.getJobInfo(job)
                    for stage in (info.stageIds if info else []):
                        st = tracker.getStageInfo(stage)
                        finished += st.numCompletedTasks if st else 0
            except Exception as e:  # progress is a courtesy: never fail the batch for it
                log.debug("read progress unavailable: %s", e)
                continue
            done = min(total, round(total * finished / len(pieces)))
            if reporting:   # the tasks' own reports, as the job's heartbeat and the orchestrator read them
                read = _reported(os.path.dirname(self.progress))
                done = min(total, read) if read is not None else done
            if done != reported and self.on_read and (len(pieces) > 1 or reporting):
                self.on_read(batch_id, done, total)
                reported = done
            if finished:
                _pause_if_asked("read", batch_id, block=False)


def merge_groups(work: list[tuple], tasks: int) -> list[list[tuple]]:
    """Buckets dealt to at most `tasks` merge tasks (a task costs tens of milliseconds of its own,
    so 32 tiny buckets in 32 tasks cost more than their work), largest staged sets first."""
    n = max(1, min(tasks, len(work)))
    ordered = sorted(work, key=lambda w: -len(w[1]))
    return [ordered[i::n] for i in range(n)]


def _merge_all(spec: StageSpec, group: list[tuple]) -> list[dict]:
    return [merge_bucket(spec, bucket, staged, current) for bucket, staged, current in group]


def _reported(checkpoint: str) -> int | None:
    try:
        r = backfill_reading(checkpoint)
    except Exception as e:  # noqa: BLE001 - progress is a courtesy
        log.debug("read progress unreadable: %s", e)
        return None
    return None if r is None else int(r["records_read"])


def _count(uri: str | None) -> int:
    if not uri:
        return 0
    from jobs.lib.delta_sink import count_rows

    return count_rows(uri)
