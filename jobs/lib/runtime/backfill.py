"""Read progress of a one-batch backfill from Spark's own task progress.

A version's first micro-batch reads the whole log, and Spark's checkpoint (and the consumer group)
move only when it commits. While it runs, `BackfillProgress` (a driver thread) turns the progress of
the batch's Spark stages into the read-progress files the orchestrator's lag reads
(`jobs.lib.source.read_progress`): the batch's start offsets (what Spark's Kafka source recorded as its
initial offsets, ``<checkpoint>/sources/<n>/0``) and end offsets (its offset log), then, about once a
second, each partition read up to start + (end - start) x the share of the scan's tasks that
finished. ``minPartitions`` splits the batch into that many tasks at least, so the figure moves in
steps of a task. The reading never counts as caught up (`orchestrator.observe.lag`), and the
files go when the batch commits.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from jobs.lib.source.read_progress import RangeReport, clear, progress_dir, source_dir, write_manifest

__all__ = ["initial_offsets", "BackfillProgress", "clear_when_committed"]

log = logging.getLogger("kappa.runtime")

POLL_SECONDS = 1.0


def initial_offsets(checkpoint: str | Path) -> dict[tuple[str, int], int] | None:
    """The offsets Spark's Kafka sources started from ({(topic, partition): offset}, every source of
    the query: ``<checkpoint>/sources/<n>/0``), or None."""
    out: dict[tuple[str, int], int] = {}
    for source in sorted((Path(checkpoint) / "sources").glob("*/0")):
        try:
            text = source.read_text(encoding="utf-8", errors="replace")
            doc = json.loads(text.strip().splitlines()[-1])
            out.update({(t, int(p)): int(o) for t, parts in doc.items() for p, o in parts.items()})
        except (OSError, ValueError, IndexError, AttributeError):
            continue
    return out or None


def _as_map(offsets: dict[str, dict[str, int]]) -> dict[tuple[str, int], int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


class BackfillProgress:
    """Driver: the read progress of batch `batch_id` while its Spark jobs in `group` run (see the module)."""

    def __init__(self, spark: Any, checkpoint: str, group: str, end: dict[str, dict[str, int]]):
        self.sc = spark.sparkContext
        self.group = group
        self.directory = progress_dir(checkpoint)
        start = initial_offsets(checkpoint) or {}
        self.end = _as_map(end)
        self.start = {tp: min(start.get(tp, 0), e) for tp, e in self.end.items()}
        self.reports: dict[tuple[str, int], RangeReport] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._first_stage: int | None = None

    def __enter__(self) -> "BackfillProgress":
        if self.directory is None or not self.end:
            return self
        where = source_dir(self.directory, sorted({t for t, _ in self.end}))
        write_manifest(where, self.start, self.end, 1)
        self.reports = {tp: RangeReport(where, tp[0], tp[1], self.start[tp], e) for tp, e in self.end.items()}
        self._thread = threading.Thread(target=self._run, name="kappa-backfill-progress", daemon=True)
        self._thread.start()
        return self

    def share_done(self) -> float:
        """The share of the backfill's scan tasks that finished (0 before its first job starts)."""
        tracker = self.sc.statusTracker()
        stages: list[int] = []
        for job in tracker.getJobIdsForGroup(self.group):
            info = tracker.getJobInfo(job)
            if info is not None:
                stages.extend(info.stageIds)
        if not stages:
            return 0.0
        if self._first_stage is None:
            self._first_stage = min(stages)
        stage = tracker.getStageInfo(self._first_stage)
        if stage is None or not stage.numTasks:
            return 0.0
        return min(1.0, stage.numCompletedTasks / stage.numTasks)

    def report(self, share: float, final: bool = False) -> None:
        for tp, r in self.reports.items():
            r.update(self.start[tp] + int(share * (self.end[tp] - self.start[tp])), final=final)

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                self.report(self.share_done())
            except Exception as e:  # noqa: BLE001 - progress is a courtesy
                log.debug("backfill progress not reported: %s", e)

    def read(self) -> None:
        """The batch is read whole (its scan finished): every partition at its end."""
        self.report(1.0, final=True)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def committed(self) -> None:
        """The batch committed: its progress is in the checkpoint now."""
        if self.directory is not None:
            clear(self.directory)


def clear_when_committed(checkpoint: str | Path) -> None:
    """Drop the backfill's read progress once its batch is in the checkpoint (the runtime's heartbeat)."""
    import os

    from jobs.lib.source.checkpoint import last_committed_batch

    where = progress_dir(checkpoint)
    if where and os.path.isdir(where) and last_committed_batch(checkpoint) is not None:
        clear(where)
