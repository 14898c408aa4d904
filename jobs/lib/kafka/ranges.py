"""``format("kappa_kafka_ranges")``: the Kafka source planned by Spark, read by the job's own tasks.

The same offsets, planning, admission control, available-now target, new partitions and
consumer-group commits as ``format("kappa_kafka")`` (`KafkaRangesReader` is a `KafkaStreamReader`
that overrides only what a micro-batch's rows are), but the rows of a micro-batch are its planned
offset ranges, not its records: one row per range a task should read (``topic``, ``partition``,
``start``, ``end``, ``new``), plus one row with ``start == end`` for every partition without new
records, so that the rows also give the batch's complete end offsets.

Why: handing a Python source's records through the JVM to a Python transform costs about as much
as the transform itself (NOTES.md: about 17 s per 2M records). A job that gets the ranges instead
(`foreachBatch` collects a few dozen rows, or plans the same rows itself from the offsets Spark
logged in the checkpoint, `logged_rows`, which spares a Spark job per batch) maps them over Spark tasks that read, transform and
write in one Python worker (`jobs.lib.bucketed`), and the records never leave the executors.
Spark still plans every micro-batch, logs its offsets in the checkpoint before running it and
commits it after, so restarts, retries and available-now work as for any source.

Options: those of ``kappa_kafka`` (`jobs.lib.kafka.options`), plus ``maxRecordsPerTask``
(default 125000): ranges are split so that no task reads more offsets than that, which bounds a
task's memory and makes the progress of a long backfill visible task by task.
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import BooleanType, IntegerType, LongType, StringType, StructField, StructType

from jobs.lib.kafka.options import SourceSettings
from jobs.lib.kafka.planning import offsets_to_map, plan_ranges
from jobs.lib.kafka.source import KafkaDataSource, KafkaStreamReader
from orchestrator.core.exceptions import SourceError

__all__ = ["RANGES_NAME", "RANGES_SCHEMA", "TASK_RECORDS", "KafkaRangesDataSource", "KafkaRangesReader",
           "split_task_ranges", "plan_rows", "logged_rows"]

RANGES_NAME = "kappa_kafka_ranges"
RANGES_SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("start", LongType()),
    StructField("end", LongType()),
    StructField("new", BooleanType()),
])
#: Default for ``maxRecordsPerTask``.
TASK_RECORDS = 125_000
_TASK_OPTION = "maxrecordspertask"


def split_task_ranges(ranges: list[tuple], max_records: int) -> list[tuple]:
    """Split (topic, partition, start, end, new) ranges into pieces of at most ``max_records``
    offsets. Every piece of a new partition keeps ``new``: the reader moves a new range's start
    up to the log start, which may lie beyond the first piece. Deterministic, order kept."""
    out: list[tuple] = []
    for topic, partition, start, end, new in ranges:
        n = max(1, math.ceil((end - start) / max(1, max_records)))
        size = max(1, math.ceil((end - start) / n))
        a = start
        while a < end:
            out.append((topic, partition, a, min(a + size, end), bool(new)))
            a += size
    return out


def plan_rows(settings: SourceSettings, task_records: int, start: dict, end: dict) -> list[tuple]:
    """The rows of the micro-batch from ``start`` to ``end`` (offset JSON): the ranges the records
    source would read (`plan_ranges`), split to ``task_records``, and an empty range at the end
    offset of every partition without new records. Deterministic in its arguments."""
    ranges = plan_ranges(offsets_to_map(start), offsets_to_map(end), min_partitions=settings.min_partitions,
                         split_min_records=settings.split_min_records)
    rows = split_task_ranges([(r.topic, r.partition, r.start, r.end, r.new) for r in ranges], task_records)
    covered = {(t, p) for t, p, *_ in rows}
    for (t, p), o in sorted(offsets_to_map(end).items()):
        if (t, p) not in covered:
            rows.append((t, p, o, o, False))
    return rows


def logged_rows(checkpoint_uri: str, batch_id: int, settings: SourceSettings, task_records: int) -> list[tuple] | None:
    """The same rows, planned on the driver from the offsets Spark logged in the query's checkpoint
    before running the batch (``offsets/<batch_id>`` and the batch before it), so a job need not run
    a Spark task to learn them. None when they cannot be known from there (a checkpoint that is not
    readable, several sources, or batch 0 of a query that does not start at the earliest offsets):
    then collect the batch's rows through Spark."""
    end = _logged_offsets(checkpoint_uri, batch_id)
    if end is None:
        return None
    if batch_id == 0:
        if settings.starting_offsets != "earliest":
            return None
        start: dict = {}   # every partition from its log start, as `initialOffset` gives
    else:
        start = _logged_offsets(checkpoint_uri, batch_id - 1)
        if start is None:
            return None
    return plan_rows(settings, task_records, start, end)


def _logged_offsets(checkpoint_uri: str, batch_id: int) -> dict | None:
    """The one source's offset JSON in ``<checkpoint>/offsets/<batch_id>`` (line 1 the log's version,
    line 2 its metadata, then one line per source), read through pyarrow's filesystems (any URI)."""
    from jobs.lib.kafka.checkpoint import parse_offset_log
    from orchestrator.core import uris

    try:
        text = uris.read_text(uris.join(checkpoint_uri, "offsets", str(int(batch_id))))
        if text is None:
            return None
        sources = parse_offset_log(text)
    except (OSError, ValueError):
        return None
    return sources[0] if len(sources) == 1 else None


class PlanPartition(InputPartition):
    """The one input partition of a micro-batch: every range row, read by one tiny task."""

    def __init__(self, rows: list[tuple]):
        self.rows = rows


class KafkaRangesDataSource(KafkaDataSource):
    """``format("kappa_kafka_ranges")``: micro-batches whose rows are offset ranges."""

    @classmethod
    def name(cls) -> str:
        return RANGES_NAME

    def schema(self) -> StructType:
        return RANGES_SCHEMA

    def streamReader(self, schema: StructType) -> "KafkaRangesReader":
        opts = {str(k).lower(): v for k, v in dict(self.options).items()}
        raw = opts.pop(_TASK_OPTION, None)
        try:
            task_records = int(raw) if raw not in (None, "") else TASK_RECORDS
        except ValueError:
            raise SourceError(f"source option maxRecordsPerTask must be an integer, got {raw!r}") from None
        if task_records < 1:
            raise SourceError(f"source option maxRecordsPerTask must be at least 1, got {task_records}")
        return KafkaRangesReader(SourceSettings.from_options(opts), task_records)


class KafkaRangesReader(KafkaStreamReader):
    """A `KafkaStreamReader` whose micro-batch rows are the planned ranges (see the module)."""

    def __init__(self, settings: SourceSettings, task_records: int = TASK_RECORDS):
        super().__init__(settings)
        self.task_records = task_records

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "task_records": self.task_records}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """Driver. `plan_rows` of the batch, as one input partition."""
        return [PlanPartition(plan_rows(self.settings, self.task_records, start, end))]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        """Executor (one tiny task per micro-batch): the range rows; no Kafka access."""
        return iter(partition.rows)
