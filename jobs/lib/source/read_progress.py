"""Read progress of a one-batch backfill: what its tasks have read before the batch commits.

A version's first micro-batch reads the whole log (``backfill=one-batch``, `jobs.lib.runtime.stream`),
and Spark's checkpoint and the consumer group move only when that batch commits, so the lag the
orchestrator measures from them would stay at its full value for the whole backfill. While the
backfill runs, the job's driver therefore reports how far its tasks have read
(`jobs.lib.runtime.backfill.BackfillProgress`), in files under ``<checkpoint>/kappa-read-progress/``:

* ``<source>/batch.json`` (`write_manifest`): the batch's start and end offsets and how many scans
  of them count (each counts for ``1/scans``). ``<source>`` is the topics joined by ``+``.
* ``<source>/<topic>~<partition>~<start>~<end>~<reader>.json`` (`RangeReport`), about once a
  second: the offset read up to in one partition's range.

The directory is deleted when the batch commits (`clear`) and started afresh when a backfill
begins, so files of a killed run never count for its replay. Progress is a courtesy: a report that
cannot be written is dropped and never fails the job.

What the offsets mean meanwhile: the Spark checkpoint and the consumer group's committed offsets
keep meaning "committed to the version's table"; during the backfill they stay at its start (the
log start) and jump to its end offsets when it commits. The files here mean "read by the running
batch, not committed": the orchestrator's lag (`orchestrator.observe.lag`) counts what is not read
yet, but never lets such a reading count as caught up.

`read_progress` and `progress_positions` run anywhere (no Spark, no broker): the orchestrator calls them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping
from urllib.parse import unquote, urlsplit

from jobs.lib.source.offsets import TP, map_to_offsets, offsets_to_map

__all__ = ["DIR_NAME", "MANIFEST", "REPORT_SECONDS", "progress_dir", "source_dir", "write_manifest", "clear",
           "RangeReport", "BatchProgress", "ReadPosition", "read_progress", "progress_positions", "backfill_reading"]

log = logging.getLogger("kappa.source")

#: The directory under a version's checkpoint that holds the read progress of its backfill.
DIR_NAME = "kappa-read-progress"
MANIFEST = "batch.json"
#: A reader task writes its report at most this often (and once more when it finishes).
REPORT_SECONDS = 1.0


def progress_dir(checkpoint: str | Path) -> str | None:
    """Where the backfill of the query checkpointed at ``checkpoint`` reports its read progress:
    a local directory (of a plain path or a ``file://`` URI); None for a checkpoint on other
    storage (``s3://``...), whose backfill reports nothing (its lag moves when it commits)."""
    text = os.fspath(checkpoint)
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", text)
    if m:
        if m.group(1).lower() != "file":
            return None
        text = unquote(urlsplit(text).path)
    return os.path.join(text, DIR_NAME)


def source_dir(directory: str, topics: tuple[str, ...] | list[str]) -> str:
    """The directory of one source (its topics) of a query; topic names never hold ``+``."""
    return os.path.join(directory, "+".join(sorted(topics)))


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)   # a reader sees the old report or the new one, never half of one


def write_manifest(directory: str, start: Mapping[TP, int], end: Mapping[TP, int], scans: int) -> None:
    """Driver, when it plans the backfill's tasks: the batch and how many scans read it. The first
    scan (``scans == 1``) empties the directory first: reports of an earlier run are gone."""
    try:
        if scans == 1:
            shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory, exist_ok=True)
        _write_json(os.path.join(directory, MANIFEST),
                    {"start": map_to_offsets(start), "end": map_to_offsets(end), "scans": int(scans)})
    except OSError as e:
        log.warning("cannot write the backfill's read progress to %s (lag will move when the batch "
                    "commits): %s", directory, e)


def clear(directory: str) -> None:
    """Driver, once the batch committed: its progress is in the checkpoint now."""
    shutil.rmtree(directory, ignore_errors=True)


def _reader_id() -> str:
    try:
        from pyspark import TaskContext

        tc = TaskContext.get()
    except Exception:  # noqa: BLE001 - outside a Spark task (tests): the process tells readers apart
        tc = None
    if tc is None:
        return f"pid{os.getpid()}"
    return f"s{tc.stageId()}p{tc.partitionId()}"


class RangeReport:
    """Executor: the read progress of one range, written to its report file (see the module)."""

    def __init__(self, directory: str, topic: str, partition: int, start: int, end: int):
        self.path = os.path.join(directory, f"{topic}~{partition}~{start}~{end}~{_reader_id()}.json")
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self._last = -REPORT_SECONDS
        self._off = False

    def update(self, position: int, final: bool = False) -> None:
        """The range is read up to ``position`` (the next offset to read); written at most every
        `REPORT_SECONDS`, and always when ``final``."""
        now = time.monotonic()
        if self._off or (not final and now - self._last < REPORT_SECONDS):
            return
        self._last = now
        try:
            _write_json(self.path, {"topic": self.topic, "partition": self.partition, "start": self.start,
                                    "end": self.end, "read_to": max(self.start, min(int(position), self.end))})
        except OSError as e:  # the directory is gone (the batch committed) or not reachable from here
            log.debug("read progress of %s[%d] not written: %s", self.topic, self.partition, e)
            self._off = True


@dataclass(frozen=True)
class BatchProgress:
    """One source's backfill as its files describe it: ``reads`` sums, per range
    ``(topic, partition, start, end)``, the offsets every reader of the range has read."""

    start: dict[TP, int]
    end: dict[TP, int]
    scans: int
    reads: dict[tuple[str, int, int, int], int] = field(default_factory=dict)


@dataclass(frozen=True)
class ReadPosition:
    """A partition's read progress in a running backfill: ``next_offset`` is the lowest offset not
    read yet by every scan (as a share of the scans), ``unread`` the offsets of the batch left to
    read, ``end`` the batch's end offset (offsets after it are not in the batch)."""

    next_offset: int
    unread: int
    end: int


def read_progress(checkpoint: str | Path) -> list[BatchProgress]:
    """The backfills reporting under a checkpoint (one per source), [] when none. Runs anywhere.

    A file being replaced or unreadable is skipped: progress is never an error."""
    where = progress_dir(checkpoint)
    root = Path(where) if where else None
    if root is None or not root.is_dir():
        return []
    out = []
    for src in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            manifest = json.loads((src / MANIFEST).read_text(encoding="utf-8"))
            start, end = offsets_to_map(manifest["start"]), offsets_to_map(manifest["end"])
            scans = max(1, int(manifest["scans"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        reads: dict[tuple[str, int, int, int], int] = {}
        for f in src.glob("*~*.json"):
            try:
                d = json.loads(f.read_text(encoding="utf-8"))
                key = (str(d["topic"]), int(d["partition"]), int(d["start"]), int(d["end"]))
                done = max(0, min(int(d["read_to"]), key[3]) - key[2])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            reads[key] = reads.get(key, 0) + done
        out.append(BatchProgress(start, end, scans, reads))
    return out


def progress_positions(batches: list[BatchProgress]) -> dict[TP, ReadPosition]:
    """Per partition, how far the running backfill has read (see `ReadPosition`). Pure.

    A range's reads count for ``1/scans`` each and never for more than the range; ranges without a
    report are unread. Where two sources read one partition, the one with more left to read wins,
    so the result never overstates progress."""
    out: dict[TP, ReadPosition] = {}
    for b in batches:
        for tp, end in b.end.items():
            first = b.start.get(tp, 0)
            if end <= first:
                continue
            ranges = sorted((s, e, min(e - s, n // b.scans)) for (t, p, s, e), n in b.reads.items()
                            if (t, p) == tp and first <= s < e <= end)
            read = sum(r for _s, _e, r in ranges)
            nxt = first
            for s, e, r in ranges:   # the lowest offset not read: past the contiguous read prefix
                if s != nxt:
                    break
                nxt = s + r
                if r < e - s:
                    break
            pos = ReadPosition(next_offset=nxt, unread=max(0, end - first - read), end=end)
            old = out.get(tp)
            if old is None or pos.unread > old.unread:
                out[tp] = pos
    return out


def backfill_reading(checkpoint: str | Path) -> dict | None:
    """The job status's ``reading`` while the backfill (batch 0 of a fresh query) is read and not
    committed: ``{"batch_id", "records_read", "records_total"}`` (offsets; each scan counts its
    share); None otherwise. Runs anywhere."""
    from jobs.lib.source.checkpoint import last_committed_batch

    batches = read_progress(checkpoint)
    if not batches or last_committed_batch(os.path.dirname(progress_dir(checkpoint))) is not None:
        return None
    total: dict[TP, int] = {}
    for b in batches:
        for tp, end in b.end.items():
            total[tp] = max(total.get(tp, 0), max(0, end - b.start.get(tp, 0)))
    unread = sum(p.unread for p in progress_positions(batches).values())
    records = sum(total.values())
    return {"batch_id": 0, "records_read": max(0, records - unread), "records_total": records}
