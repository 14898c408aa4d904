"""JSON event schemas of the seed jobs and their parsing; the plumbing the seed jobs share.

Every record of the seed topics is a Kafka record whose value is a UTF-8 JSON object:

=================  =====================  ==================================================
topic (role)       key                    value fields
=================  =====================  ==================================================
page views         member id              view_id, member_id, page, viewed_at
member profiles    member id              name; title, company, location, zip (optional)
member settings    member id              language, email_notifications, visibility (opt.)
ad impressions     impression id          impression_id, ad_id, member_id, shown_at
ad clicks          impression id          click_id, impression_id, member_id, clicked_at
=================  =====================  ==================================================

Timestamps are ISO-8601 strings with a UTC offset (``2024-05-01T10:15:00Z``); a timestamp
without an offset is rejected rather than guessed. A field naming the record's identity
(``member_id`` of a page view, ``impression_id`` of an ad event) must equal the record key:
the keyed-state jobs group by the key, so a value that disagrees with it would join the wrong state.
A profile needs a name, as the standardize job over the same topic requires, so that every job
reading `member_profiles` agrees on which records are valid. Unknown fields are ignored.
Profiles and settings are changelogs: a null value (tombstone) deletes the member, and the
caller handles it before parsing. Events have no tombstones; a null value is rejected.

Parsing never raises: it returns the typed row or the reason the record was rejected, and
the jobs write that reason to the version's rejects table. The functions here are plain
Python and pyarrow, picklable, and run on Spark executors (inside ``mapInArrow`` and the
stateful pandas functions) as well as in the tests.

The second half is what the four seed jobs (`pageviews_hourly`, `profile_settings_join`,
`pageview_enrich`, `ad_click_join`) share around Spark: each job's query is one stream of output
rows, reject rows and counts of records read (`TAIL_DDL`), which `SeedBatchWriter` splits in
foreachBatch into the version's rejects table and output table (idempotent Delta commits), and
reports to the runtime's status.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Iterator

import pyarrow as pa

STRING, TIMESTAMP, BOOL = "string", "timestamp", "bool"

_ARROW_TYPES = {STRING: pa.string(), TIMESTAMP: pa.timestamp("us", tz="UTC"), BOOL: pa.bool_()}
_SPARK_TYPES = {STRING: "string", TIMESTAMP: "timestamp", BOOL: "boolean"}


@dataclass(frozen=True)
class EventType:
    """The JSON schema of one topic's values.

    `fields` maps a field name to (type, required). `key_field` names the value field that must
    equal the record key (None: the key alone is the identity, and a value field of that name,
    when present, must match it too). `choices` restricts string fields to a set of values.
    """

    name: str
    key_name: str
    fields: dict[str, tuple[str, bool]]
    key_field: str | None = None
    choices: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(n, _ARROW_TYPES[t]) for n, (t, _) in self.fields.items()])

    def spark_ddl(self) -> str:
        return ", ".join(f"{n} {_SPARK_TYPES[t]}" for n, (t, _) in self.fields.items())


PAGE_VIEW = EventType(
    name="page view", key_name="member_id", key_field="member_id",
    fields={"view_id": (STRING, True), "member_id": (STRING, True), "page": (STRING, True),
            "viewed_at": (TIMESTAMP, True)},
)
PROFILE = EventType(
    name="member profile", key_name="member_id",
    fields={"name": (STRING, True), "title": (STRING, False), "company": (STRING, False),
            "location": (STRING, False), "zip": (STRING, False)},
)
SETTINGS = EventType(
    name="member settings", key_name="member_id",
    fields={"language": (STRING, False), "email_notifications": (BOOL, False),
            "visibility": (STRING, False)},
    choices=(("visibility", ("public", "connections", "private")),),
)
AD_IMPRESSION = EventType(
    name="ad impression", key_name="impression_id", key_field="impression_id",
    fields={"impression_id": (STRING, True), "ad_id": (STRING, True), "member_id": (STRING, True),
            "shown_at": (TIMESTAMP, True)},
)
AD_CLICK = EventType(
    name="ad click", key_name="impression_id", key_field="impression_id",
    fields={"click_id": (STRING, True), "impression_id": (STRING, True), "member_id": (STRING, True),
            "clicked_at": (TIMESTAMP, True)},
)


def parse_timestamp(text: str) -> datetime | None:
    """An ISO-8601 string with a UTC offset as an aware UTC datetime; None if it is not one."""
    try:
        ts = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    if ts.tzinfo is None:
        return None
    return ts.astimezone(timezone.utc)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def decode_key(et: EventType, key: bytes | None) -> tuple[str | None, str | None]:
    """(key text, None) or (None, reason)."""
    if key is None:
        return None, f"null key: {et.name} records are keyed by {et.key_name}"
    try:
        text = bytes(key).decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"key is not UTF-8 ({e.reason} at byte {e.start})"
    if not text:
        return None, f"empty key: {et.name} records are keyed by {et.key_name}"
    return text, None


def parse_value(et: EventType, key: str, value: bytes | None) -> tuple[dict[str, Any] | None, str | None]:
    """Parse one record's value (key already decoded): (typed row, None) or (None, reason)."""
    if value is None:
        return None, f"null value: {et.name} events have no tombstones"
    try:
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"value is not UTF-8 ({e.reason} at byte {e.start})"
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        return None, f"value is not JSON: {e}"
    if not isinstance(obj, dict):
        return None, f"value is not a JSON object but {type(obj).__name__}"
    row: dict[str, Any] = {}
    for name, (typ, required) in et.fields.items():
        raw = obj.get(name)
        if raw is None:
            if required:
                return None, f"field {name!r} is missing"
            row[name] = None
            continue
        if typ == BOOL:
            if not isinstance(raw, bool):
                return None, f"field {name!r} must be true or false, got {raw!r}"
            row[name] = raw
        elif not isinstance(raw, str):
            return None, f"field {name!r} must be a string, got {type(raw).__name__} {raw!r}"
        elif not _is_utf8(raw):
            return None, f"field {name!r} holds invalid unicode (a lone surrogate): {raw!r}"
        elif typ == TIMESTAMP:
            ts = parse_timestamp(raw)
            if ts is None:
                return None, f"field {name!r} is not an ISO-8601 timestamp with a UTC offset: {raw!r}"
            row[name] = ts
        else:
            row[name] = raw
    for name, allowed in et.choices:
        if row.get(name) is not None and row[name] not in allowed:
            return None, f"field {name!r} is {row[name]!r}, expected one of {', '.join(allowed)}"
    ident = et.key_field or et.key_name
    if ident in obj and obj[ident] != key:
        return None, f"field {ident!r} is {obj[ident]!r} but the record key is {key!r}"
    return row, None


def parse_record(et: EventType, key: bytes | None,
                 value: bytes | None) -> tuple[dict[str, Any] | None, str | None]:
    """Parse one record: (typed row, None) or (None, reject reason). Never raises."""
    text, error = decode_key(et, key)
    if error:
        return None, error
    return parse_value(et, text, value)


# -- Arrow: the stateless parse step of the jobs built on Spark's native operators -------------

#: Columns passed through from the Kafka source next to the parsed fields.
POSITION_FIELDS = [pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
                   pa.field("offset", pa.int64()), pa.field("timestamp", pa.timestamp("us", tz="UTC"))]
RAW_FIELDS = [pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("error", pa.string())]


def parsed_schema(et: EventType) -> pa.Schema:
    """Schema of `parse_batches` output: typed fields, source position, and for rejects raw key,
    value and the reason (`error` is null exactly for the rows that parsed)."""
    return pa.schema(list(et.arrow_schema()) + POSITION_FIELDS + RAW_FIELDS)


def parsed_ddl(et: EventType) -> str:
    return (et.spark_ddl() + ", topic string, partition int, offset bigint, timestamp timestamp, "
            "key binary, value binary, error string")


def parse_batches(et: EventType, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`mapInArrow` function: Kafka source batches in, `parsed_schema(et)` batches out.

    Runs on executors. One output row per input row, so no record disappears here: a record
    either parses (typed fields set, `error` null, raw bytes dropped) or becomes a reject row
    (typed fields null, raw key and value kept, `error` the reason).
    """
    schema = parsed_schema(et)
    names = list(et.fields)
    for batch in batches:
        cols: dict[str, list] = {n: [] for n in names}
        raw_key, raw_value, errors = [], [], []
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        for k, v in zip(keys, values):
            row, error = parse_record(et, k, v)
            if error is None:
                for n in names:
                    cols[n].append(row[n])
                raw_key.append(None)
                raw_value.append(None)
            else:
                for n in names:
                    cols[n].append(None)
                raw_key.append(k)
                raw_value.append(v)
            errors.append(error)
        arrays = [pa.array(cols[n], type=schema.field(n).type) for n in names]
        arrays += [batch.column(f.name).cast(f.type) for f in POSITION_FIELDS]
        arrays += [pa.array(raw_key, pa.binary()), pa.array(raw_value, pa.binary()),
                   pa.array(errors, pa.string())]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)


# -- Plumbing shared by the seed jobs: rejects, input counts, the micro-batch writer -------------

DELETED = "_deleted"
REJECT_COLUMNS = ["key", "value", "topic", "partition", "offset", "error"]
#: Columns every seed job's stream carries after its output columns. A row is a reject when
#: `error` is set, a count of source records read when `input_rows` is set, else an output row.
TAIL_DDL = ("key binary, value binary, topic string, partition int, offset bigint, error string, "
            "input_rows bigint")
TAIL_COLUMNS = [c.split(" ")[0] for c in TAIL_DDL.split(", ")]


def null_columns(ddl: str) -> list:
    """Spark columns of nulls named and typed as in `ddl` ("a string, b bigint"), for the branch of
    a union that does not have them."""
    from pyspark.sql import functions as F

    return [F.lit(None).cast(t).alias(n) for n, t in (c.strip().split(" ", 1) for c in ddl.split(","))]


def rejects_and_counts(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`mapInArrow` function over `parse_batches` output: its reject rows, plus one row counting
    the records of each non-empty batch (`input_rows`), so the job can report exactly how many
    records it read even though its output holds aggregates or joined pairs. Runs on executors."""
    import pyarrow.compute as pc

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


def reject_row(record, error: str) -> dict:
    """A reject row (`TAIL_DDL` columns) of one source record (a pandas itertuples row)."""
    return {"key": record.key, "value": record.value, "topic": record.topic,
            "partition": int(record.partition), "offset": int(record.offset), "error": error}


def rows_frame(rows: list[dict], columns: list[str]):
    """The pandas frame a stateful function yields: missing columns and NaN become None (null)."""
    import pandas as pd

    return pd.DataFrame.from_records(rows, columns=columns).astype(object).where(lambda d: d.notna(), None)


def app_id(pipeline: str, version: int | str) -> str:
    """The Delta application id of a pipeline version (contract: kappa.<pipeline>.v<N>)."""
    return f"kappa.{pipeline}.v{version}"


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

    def __init__(self, sink, output_schema: pa.Schema, *, mode: str, key_columns: list[str] | None = None,
                 end_offsets=None, on_batch=None, log=None):
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

    def __call__(self, df, batch_id: int) -> None:
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
        self.write(df.toArrow(), batch_id)

    def split(self, table: pa.Table, batch_id: int) -> tuple[pa.Table, pa.Table, int]:
        """(output rows in `output_schema` (+ `_deleted` when upserting), rejects with batch_id,
        records read)."""
        import pyarrow.compute as pc

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
        from jobs.lib.delta_sink import count_rows

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


def make_writer(ctx, output_schema: pa.Schema, *, mode: str, key_columns: list[str] | None = None,
                log=None) -> SeedBatchWriter:
    """The SeedBatchWriter of a job run by `jobs.lib.runtime` (paths, app id and metadata from its
    arguments; end offsets of each batch from its Spark checkpoint)."""
    from jobs.lib.delta_sink import DeltaSink
    from jobs.lib.kafka import checkpoint_offsets

    args = ctx.args
    sink = DeltaSink(args.output, args.rejects, app_id(args.pipeline, args.version),
                     {"pipeline": args.pipeline, "version": args.version})
    return SeedBatchWriter(sink, output_schema, mode=mode, key_columns=key_columns,
                           end_offsets=lambda b: checkpoint_offsets(args.checkpoint, b),
                           on_batch=ctx.record_batch, log=log)


def job_topics(ctx, roles: tuple[str, ...], job: str) -> list[str]:
    """`--topics` split into the job's topic roles, in order; ConfigError when the count differs."""
    from orchestrator.core.exceptions import ConfigError

    topics = list(ctx.args.topics_list)
    if len(topics) != len(roles):
        raise ConfigError(
            f"job {job} reads {len(roles)} topic(s) in this order: {', '.join(roles)}; got --topics "
            f"{','.join(topics)!r}: pass --topics {','.join(f'<{r}>' for r in roles)}")
    return topics


_DURATION = re.compile(r"^\d+ (second|minute|hour|day)s?$")


def job_options(ctx, defaults: dict[str, str], job: str) -> dict[str, str]:
    """The job-specific `--extra` options (durations such as "10 minutes") over their defaults;
    ConfigError naming an unknown option or a malformed duration."""
    from orchestrator.core.exceptions import ConfigError

    extra = {k: v for k, v in (ctx.extra or {}).items() if k != "source_options"}
    unknown = sorted(set(extra) - set(defaults))
    if unknown:
        raise ConfigError(f"job {job} has no option {', '.join(map(repr, unknown))} in --extra; "
                          f"known options: {', '.join(sorted(defaults))} (and source_options)")
    out = {**defaults, **extra}
    for k, v in out.items():
        if not isinstance(v, str) or not _DURATION.match(v.strip()):
            raise ConfigError(f"--extra option {k!r} of job {job} must be a duration such as "
                              f"\"10 minutes\" or \"2 hours\", got {v!r}")
        out[k] = v.strip()
    return out


def start_query(ctx, df, writer: SeedBatchWriter, *, output_mode: str, job: str):
    """Start a seed job's streaming query: foreachBatch into `writer`, the job's checkpoint and
    trigger. Returns the StreamingQuery (the runtime contract of `build(ctx)`)."""
    return (
        df.writeStream.queryName(f"{job}_{ctx.args.pipeline}_v{ctx.args.version}")
        .outputMode(output_mode)
        .foreachBatch(writer)
        .option("checkpointLocation", ctx.args.checkpoint)
        .trigger(**ctx.trigger_kwargs())
        .start()
    )
