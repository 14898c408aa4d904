"""What a job's ``build(ctx)`` gets (`JobContext`), and how batch progress reaches its status."""

from __future__ import annotations

import argparse
import json
import logging
import threading
from pathlib import Path
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from jobs.lib.runtime.status import Status
from jobs.lib.source.offsets import map_to_offsets, merge_offsets, offsets_to_map
from orchestrator.core.exceptions import KappaError

__all__ = ["JobContext", "ProgressListener"]

log = logging.getLogger("kappa.runtime")


class JobContext:
    """What a job's ``build(ctx)`` gets: arguments, the SparkSession, the source, the status."""

    def __init__(self, args: argparse.Namespace, spark: Any, status: Status):
        self.args = args
        self.spark = spark
        self.status = status
        self.run_dir = Path(args.run_dir)
        self.extra: dict = dict(args.extra or {})
        self._lock = threading.Lock()
        self._reported: dict[int, tuple[int, int, int]] = {}
        self._counted_batches: set[int] = set()
        self._rules_hash: str | None = None
        self._group_committing = False
        self._group_end: dict | None = None

    @property
    def rules_hash(self) -> str | None:
        return self._rules_hash

    @rules_hash.setter
    def rules_hash(self, value: str | None) -> None:
        self._rules_hash = value
        self.status.update(rules_hash=value)

    def kafka_options(self, topics: list[str] | str | None = None) -> dict[str, str]:
        """The options of Spark's Kafka source for this version (`jobs.lib.runtime.stream.kafka_options`):
        ``--extra`` ``source_options`` override them."""
        from jobs.lib.runtime.stream import kafka_options

        if topics is None:
            topics = self.args.topics_list
        if not isinstance(topics, str):
            topics = ",".join(topics)
        try:
            cores = max(1, int(self.spark.sparkContext.defaultParallelism))
        except Exception:
            cores = None
        overrides = {str(k): v if isinstance(v, str) else json.dumps(v)
                     for k, v in (self.extra.get("source_options") or {}).items()}
        return kafka_options(self.args.bootstrap_servers, topics, kafka_config=self.args.kafka_config,
                             max_offsets_per_trigger=self.args.max_records_per_batch, min_partitions=cores,
                             overrides=overrides)

    def trigger_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``DataStreamWriter.trigger`` from ``--trigger``/``--interval-seconds``."""
        if self.args.trigger == "available-now":
            return {"availableNow": True}
        return {"processingTime": f"{max(1, int(round(self.args.interval_seconds * 1000)))} milliseconds"}

    def record_batch(self, batch_id: int, rows_in: int, rows_out: int, rejects: int = 0,
                     rejects_total: int | None = None, timing: dict[str, float] | None = None) -> None:
        """Called by the job (from foreachBatch, on the driver) once a batch's output is written.

        Re-reporting a batch replaces its counts. `timing` (the batch's seconds per stage and its Spark
        job count, `jobs.lib.sink.batches`) becomes the status's ``last_batch``; a timing that marks the
        version's backfill (``timing["backfill"]``: the offsets it planned and its end offsets) also becomes
        the status's ``backfill``, once per process: records, offsets, seconds of the batch and when it
        was written, which the orchestrator keeps as the version's measured backfill. Writes status.json at once.
        """
        batch_id = int(batch_id)
        with self._lock:
            old = self._reported.get(batch_id, (0, 0, 0))
            new = (int(rows_in), int(rows_out), int(rejects))
            self._reported[batch_id] = new
            d = self.status.data
            fields: dict[str, Any] = {"rows_out": d["rows_out"] + new[1] - old[1],
                                      "rejects": d["rejects"] + new[2] - old[2]}
            if batch_id not in self._counted_batches:  # else the listener counted its input already
                fields["rows_in"] = d["rows_in"] + new[0] - old[0]
            if rejects_total is not None:
                fields["rejects_total"] = int(rejects_total)
            if timing is not None:
                fields["last_batch"] = {"batch_id": batch_id, "records": new[0],
                                        **{k: round(v, 3) if isinstance(v, float) else v for k, v in timing.items()
                                           if k not in ("batch_id", "backfill")}}
                if isinstance(timing.get("backfill"), dict) and d.get("backfill") is None:
                    fields["backfill"] = _backfill_measure(batch_id, new[0], timing)
            self.status.update(**fields)

    def on_progress(self, progress: dict) -> None:
        """A completed micro-batch, from the listener or the query's recent progress."""
        try:
            batch_id = int(progress.get("batchId"))
        except (TypeError, ValueError):
            return
        ran = "addBatch" in (progress.get("durationMs") or {}) or (progress.get("numInputRows") or 0) > 0
        with self._lock:
            if batch_id in self._counted_batches or not ran:
                return
            self._counted_batches.add(batch_id)
            d = self.status.data
            fields: dict[str, Any] = {"batch_id": batch_id if d["batch_id"] is None else max(batch_id, d["batch_id"]),
                                      "batches": d["batches"] + 1}
            if batch_id not in self._reported:
                fields["rows_in"] = d["rows_in"] + int(progress.get("numInputRows") or 0)
            end = _source_end_offsets(progress)
            if end is not None and fields["batch_id"] == batch_id:
                fields["end_offsets"] = end
            self.status.update(**fields)
        if end is not None:   # Spark's Kafka source never commits to a consumer group: kappa does
            self._commit_to_group(end)

    def _commit_to_group(self, end: dict) -> None:
        """The batch's end offsets to the version's consumer group, so Kafka's own tools
        (``kafka-consumer-groups --describe``) show the lag kappa shows. Off the listener's thread."""
        from jobs.lib.source.consumer_groups import commit_group_offsets

        args = self.args
        if not args.group_id:
            return

        with self._lock:
            self._group_end = end          # the newest batch's; a commit still running takes it next
            if self._group_committing:
                return                     # one commit thread at a time, however slow the broker is
            self._group_committing = True

        def commit() -> None:
            while True:
                with self._lock:
                    latest, self._group_end = self._group_end, None
                    if latest is None:
                        self._group_committing = False
                        return
                try:
                    commit_group_offsets(args.bootstrap_servers, args.group_id, latest, args.kafka_config)
                except Exception as e:  # noqa: BLE001 - the checkpoint is the truth; the group is for tools
                    log.warning("cannot commit offsets to the consumer group %s: %s", args.group_id, e)

        threading.Thread(target=commit, name="kappa-group-commit", daemon=True).start()


def _backfill_measure(batch_id: int, records: int, timing: dict[str, Any]) -> dict[str, Any]:
    """The status's ``backfill``: the batch's records and planned offsets, its seconds (read to write, upkeep left
    out) and the time its output was written (`committed_at`, before its upkeep ran)."""
    import time

    seconds = sum(float(timing.get(k) or 0.0) for k in ("read_transform_count", "rejects", "write"))
    return {"batch_id": batch_id, "records": int(records), "offsets": timing["backfill"].get("offsets"),
            "end_offsets": timing["backfill"].get("end_offsets"), "seconds": round(seconds, 3),
            "committed_at": time.time() - float(timing.get("upkeep") or 0.0)}


def _source_end_offsets(progress: dict) -> dict | None:
    """The kappa Kafka sources' end offsets in a progress report, merged into one offset JSON."""
    maps = []
    for src in progress.get("sources") or []:
        end = src.get("endOffset")
        if isinstance(end, str):
            try:
                end = json.loads(end)
            except ValueError:
                continue
        try:
            maps.append(offsets_to_map(end))
        except KappaError:
            continue
    merged = merge_offsets(maps)
    return map_to_offsets(merged) if merged else None


class ProgressListener(StreamingQueryListener):
    """Forwards the progress of the job's query to its context (runs on a py4j thread).

    Registered before the query starts, so progress that arrives before `attach` is buffered.
    """

    def __init__(self) -> None:
        self.ctx: JobContext | None = None
        self.query_id: str | None = None
        self.buffer: list[dict] = []
        self.lock = threading.Lock()

    def attach(self, ctx: JobContext, query_id: str) -> None:
        with self.lock:
            self.ctx, self.query_id = ctx, query_id
            pending, self.buffer = self.buffer, []
        for p in pending:
            if p.get("id") == query_id:
                ctx.on_progress(p)

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        try:
            p = json.loads(event.progress.json)
        except Exception:
            return
        with self.lock:
            if self.ctx is None:
                self.buffer.append(p)
                return
            ctx, qid = self.ctx, self.query_id
        if p.get("id") == qid:
            try:
                ctx.on_progress(p)
            except Exception:
                log.exception("could not record batch progress")

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass
