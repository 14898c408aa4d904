"""``format("kappa_kafka")``: the Kafka source's Spark DataSource and its stream reader.

Where each part runs:

* ``KafkaDataSource`` and ``KafkaStreamReader.__init__`` run on the driver, in the planner process
  and in the long-lived Python process that serves the streaming engine; the reader is pickled to
  the executors, so it holds settings only and opens Kafka clients lazily.
* ``initialOffset``, ``latestOffset``, ``prepareForTriggerAvailableNow``, ``partitions``,
  ``commit``, ``reportLatestOffset`` and ``stop`` run on the driver, in that one process, so the
  admin client and the available-now target survive between calls.
* ``read`` runs on an executor, once per ``KafkaRange``, with a consumer of its own
  (`jobs.lib.kafka.reading`).

Spark pickles these classes by module path (``jobs.lib.kafka.source``), so every process that
runs them imports this module.
"""

from __future__ import annotations

import json
import logging
from typing import Iterator, Sequence

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from jobs.lib.kafka.broker import Broker
from jobs.lib.kafka.options import SourceSettings
from jobs.lib.kafka.planning import TP, map_to_offsets, offsets_to_map, plan_end_offsets, plan_ranges
from jobs.lib.kafka.progress import clear as clear_progress, source_dir, write_manifest
from jobs.lib.kafka.reading import SCHEMA, KafkaRange, read_range
from orchestrator.core.exceptions import SourceError

__all__ = ["NAME", "KafkaDataSource", "KafkaStreamReader"]

log = logging.getLogger("kappa.source")

NAME = "kappa_kafka"


class KafkaDataSource(DataSource):
    """``format("kappa_kafka")``: a streaming source over one or more Kafka topics."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> "KafkaStreamReader":
        """Runs on the driver; validates the options so a mistake fails before the query starts."""
        return KafkaStreamReader(SourceSettings.from_options(self.options))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver and reads offset ranges on executors.

    Picklable: only ``settings`` travels; Kafka clients and the available-now target live in the
    driver's long-lived Python process and are dropped on pickling.
    """

    def __init__(self, settings: SourceSettings):
        self.settings = settings
        self._broker: Broker | None = None
        self._target: dict[TP, int] | None = None
        self._latest: dict[TP, int] | None = None
        self._group_committed: dict[TP, int] | None = None
        self._initial: dict[TP, int] | None = None  # a fresh query's start, until its first batch
        self._first: dict[TP, int] | None = None    # a fresh query's start, for ever
        self._reporting: tuple[dict, dict, int] | None = None  # the backfill reporting progress, scans

    def __getstate__(self) -> dict:
        return {"settings": self.settings, "_broker": None, "_target": None, "_latest": None,
                "_group_committed": None, "_initial": None, "_first": None, "_reporting": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            self._broker = Broker(self.settings)
        return self._broker

    # --- driver ---------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        """Driver. Earliest (or the given starting offsets) for every partition of every topic."""
        tps = self.broker.partitions(required=True)
        wms = self.broker.watermarks(tps)
        mode = self.settings.starting_offsets
        given = {} if mode in ("earliest", "latest") else offsets_to_map(json.loads(mode))
        start: dict[TP, int] = {}
        for tp in tps:
            o = given.get(tp, -1 if mode == "latest" else -2)
            start[tp] = wms[tp].low if o == -2 else wms[tp].high if o == -1 else o
        unknown = sorted(set(given) - set(tps))
        if unknown:
            raise SourceError(f"starting.offsets names partitions that do not exist: {unknown}; "
                              f"existing partitions: {tps}")
        log.info("initial offsets %s", map_to_offsets(start))
        # Spark asks for initial offsets only while its checkpoint has none for this source: the
        # next batch planned from them is a fresh query's first, the backfill.
        self._initial = dict(start)
        self._first = dict(start)
        return map_to_offsets(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        """Driver. At most ``maxOffsetsPerTrigger`` records (offsets) per micro-batch (the first
        batch of a fresh query is exempt under ``backfill=one-batch``, see `latestOffset`)."""
        return ReadMaxRows(self.settings.max_records_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        """Driver, once at the start of an available-now query: fix the end offsets to reach."""
        tps = self.broker.partitions(required=True)
        wms = self.broker.watermarks(tps)
        self._target = {tp: w.high for tp, w in wms.items()}
        log.info("available-now target offsets %s", map_to_offsets(self._target))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Driver. End offsets of the next micro-batch: up to the latest offsets (or the
        available-now target), capped by ``limit``; new partitions are included from offset 0.

        Backfill (``backfill=one-batch``, the default): the first batch of a fresh query, planned
        from the offsets `initialOffset` returned, is not capped. A per-partition cap would let
        partitions of different event density drift apart in event time, and a watermark that
        follows the fastest one drops the others' rows as late; in one batch every operator sees
        the whole backfill at once. Later batches (the live tail) are capped. A restart replays a
        logged batch with its logged offsets, so the decision is made once per batch.
        """
        start_map = offsets_to_map(start)
        # Spark only asks for the next batch once the previous one is committed, so ``start`` is
        # processed: committing it here keeps the group current while the query idles and after
        # the last available-now batch (Spark calls commit() only when it plans the next batch).
        self._commit_group(start_map)
        self._drop_progress(start_map)
        tps = self.broker.partitions(required=False)
        wms = self.broker.watermarks(tps, tolerate=True)
        self._latest = {tp: w.high for tp, w in wms.items()}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if not isinstance(limit, (ReadMaxRows, ReadAllAvailable)):
            log.warning("read limit %r is not supported; reading all available", limit)
        backfill = (self.settings.backfill == "one-batch" and self._initial is not None
                    and start_map == self._initial)
        plan = plan_end_offsets(start_map, wms, max_rows=None if backfill else max_rows,
                                target=self._target, on_missing=self.settings.on_missing_offsets)
        if backfill and plan.end != start_map:
            self._initial = None
            log.info("backfill: the first micro-batch reads %d offsets up to %s in one batch (no "
                     "per-batch cap; later batches take at most %s)",
                     sum(e - start_map.get(tp, 0) for tp, e in plan.end.items()),
                     map_to_offsets(plan.end), max_rows)
        for (t, p), (a, b) in plan.skipped.items():
            if b > a:
                log.warning("failOnDataLoss=false: %s[%d] skips offsets %d..%d (%d offsets the "
                            "broker no longer has)", t, p, a, b - 1, b - a)
            else:
                log.warning("failOnDataLoss=false: %s[%d] checkpointed offset %d is beyond the "
                            "log end; continuing from the log start %d", t, p, a, b)
        for t, p in plan.new_partitions:
            if start_map:
                log.info("new partition %s[%d] found; reading it from offset 0", t, p)
        return map_to_offsets(plan.end)

    def reportLatestOffset(self) -> dict | None:
        """Driver. The latest offsets seen by the last `latestOffset` call (for query progress)."""
        return map_to_offsets(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """Driver. One `KafkaRange` per partition with data, large ones split (deterministic).

        The ranges of a one-batch backfill (the first batch of a fresh query, with ``readProgressDir``
        set) report their read progress (`jobs.lib.kafka.progress`). Spark asks once per scan of
        the source in the query's plan, before any task runs: the count is in the manifest."""
        start_map, end_map = offsets_to_map(start), offsets_to_map(end)
        ranges = plan_ranges(start_map, end_map, min_partitions=self.settings.min_partitions,
                             split_min_records=self.settings.split_min_records)
        where = self._progress_for(start_map, end_map) if ranges else None
        return [KafkaRange(r.topic, r.partition, r.start, r.end, r.new, progress=where) for r in ranges]

    def _progress_for(self, start: dict[TP, int], end: dict[TP, int]) -> str | None:
        """The directory the backfill's ranges report to, its manifest written; None for other batches."""
        s = self.settings
        if not s.read_progress_dir or s.backfill != "one-batch" or self._first is None or start != self._first:
            return None
        where = source_dir(s.read_progress_dir, s.topics)
        if self._reporting is not None and (self._reporting[0], self._reporting[1]) == (start, end):
            scans = self._reporting[2] + 1
        else:
            scans = 1
        self._reporting = (dict(start), dict(end), scans)
        write_manifest(where, start, end, scans)
        return where

    def commit(self, end: dict) -> None:
        """Driver, after Spark committed the batch ending at ``end``: tell the consumer group, and
        drop the backfill's read progress once the backfill is in the checkpoint.

        Best effort: the Spark checkpoint is the truth, a failed group commit is only logged.
        """
        end_map = offsets_to_map(end)
        self._commit_group(end_map)
        self._drop_progress(end_map)

    def _drop_progress(self, processed: dict[TP, int]) -> None:
        """Driver: the backfill's read progress goes once its end is processed (`commit`, or the
        next `latestOffset`, since Spark calls `commit` only when a next batch has data)."""
        if self._reporting is not None and all(processed.get(tp, -1) >= o for tp, o in self._reporting[1].items()):
            clear_progress(source_dir(self.settings.read_progress_dir, self.settings.topics))
            self._reporting = None

    def _commit_group(self, offsets: dict[TP, int]) -> None:
        if not self.settings.group_id or not offsets:
            return
        if offsets == self._group_committed and not self.broker.commit_failed:
            return
        try:
            self.broker.commit_failed = False
            self.broker.commit_group(self.settings.group_id, offsets)
            self._group_committed = dict(offsets)
        except Exception as e:
            log.warning("could not commit offsets to consumer group %s (lag tools will lag behind; "
                        "the Spark checkpoint is unaffected): %s", self.settings.group_id, e)

    def stop(self) -> None:
        """Driver, when the query terminates."""
        if self._broker is not None:
            self._broker.close()
            self._broker = None

    # --- executor -------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator:
        """Executor. Yields pyarrow RecordBatches of the records in ``[start, end)``. Stateless."""
        return read_range(self.settings, partition)
