"""The standardize job's transform: member-profile records in, standardized rows and rejects out.

Pure Arrow in, Arrow out, on the driver; no Spark. The input is the Kafka source's columns
(`INPUT_COLUMNS`) of a compacted topic keyed by member id (UTF-8), values JSON profiles
`{"name", "title", "company", "location", "updated_at"}` (name required, the others strings or
null, unknown fields ignored), null values are tombstones. `transform_batch` gives one row per
touched key in `OUTPUT_SCHEMA` plus `_deleted` (the latest offset per key wins), and the records
that cannot be used (no key, key not UTF-8, invalid JSON, not an object, missing name, wrong types)
as rejects with their partition, offset and reason.

The JSON values are parsed by pyarrow with an explicit schema, in one call per slice of the batch
(a few slices in parallel threads); a parse error costs one retry around the bad record, which
alone goes through a strict record-by-record parser that gives the reason (values pyarrow cannot
take line by line go that way too). Rules are applied to the distinct titles and companies only,
and mapped back.
"""

from __future__ import annotations

import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from jobs.lib.delta_sink import DELETED, REJECTS_SCHEMA, latest_per_key
from jobs.lib.rules import Rules

__all__ = [
    "KEY_COLUMNS", "DELETED", "INPUT_COLUMNS", "PROFILE_FIELDS", "PROFILE_SCHEMA", "OUTPUT_SCHEMA",
    "BatchResult", "parse_one", "parse_profiles", "decode_keys", "transform_batch", "reject_table",
    "thread_pool",
]

KEY_COLUMNS = ["member_id"]
INPUT_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp"]
PROFILE_FIELDS = ("name", "title", "company", "location", "updated_at")
PROFILE_SCHEMA = pa.schema([(f, pa.string()) for f in PROFILE_FIELDS])
OUTPUT_SCHEMA = pa.schema([
    ("member_id", pa.string()),
    ("name", pa.string()),
    ("title_raw", pa.string()),
    ("title", pa.string()),
    ("company_raw", pa.string()),
    ("company", pa.string()),
    ("location", pa.string()),
    ("source_partition", pa.int32()),
    ("source_offset", pa.int64()),
    ("source_timestamp", pa.timestamp("us", tz="UTC")),
])

_PARSE = pj.ParseOptions(explicit_schema=PROFILE_SCHEMA, unexpected_field_behavior="ignore")
#: A parse error closer than DENSE_ROWS records sends the next SLOW_WINDOW records the slow way.
DENSE_ROWS = 64
SLOW_WINDOW = 256
#: Threads that parse a large micro-batch in slices, and the fewest values worth a thread.
PARSE_THREADS = max(1, min(4, os.cpu_count() or 1))
PARSE_MIN_PER_THREAD = 20_000
_ERROR_ROW = re.compile(r"in row (\d+)\s*$")
#: A \uXXXX escape inside an object key: pyarrow matches "na\u006de" to the field name but does
#: not see it given twice, so such values go record by record.
_ESCAPE_IN_KEY = r'\\u[0-9A-Fa-f]{4}(?:[^"\\]|\\.)*"\s*:'


@dataclass
class BatchResult:
    """What one micro-batch becomes: one row per touched key (with `_deleted`) and the rejects."""

    upserts: pa.Table
    rejects: pa.Table
    rows_in: int
    tombstones: int
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def rows_out(self) -> int:
        return self.upserts.num_rows


class _Lines:
    """Values joined by line breaks into one buffer, once; any run of them parses without a copy."""

    def __init__(self, values: pa.Array):
        joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()), values),
                                b"\n")
        self.buf = joined[0].as_buffer()
        lengths = pc.binary_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
        self.starts = np.concatenate([[0], np.cumsum(lengths + 1)])  # line i: [starts[i], starts[i+1]-1)
        self.n = len(values)

    def read(self, a: int, b: int) -> pa.Table:
        """Parse values [a, b) in one pyarrow call (one block, one thread, so that the row an error
        names is the value's index); raises on any error."""
        buf = self.buf.slice(int(self.starts[a]), int(self.starts[b] - 1 - self.starts[a]))
        opts = pj.ReadOptions(use_threads=False, block_size=max(1 << 20, buf.size + 1))
        table = pj.read_json(pa.BufferReader(buf), read_options=opts, parse_options=_PARSE)
        if table.num_rows != b - a:  # a value holding two objects: more rows than values
            raise pa.ArrowInvalid(f"{table.num_rows} JSON rows for {b - a} values")
        return table


def _error_row(error: Exception, n: int) -> int | None:
    m = _ERROR_ROW.search(str(error))
    row = int(m.group(1)) if m else None
    return row if row is not None and 0 <= row < n else None


def _single_line_objects(values: pa.Array) -> np.ndarray:
    """Mask of values pyarrow can take line by line: valid UTF-8, '{' first, '}' last, no line break,
    no escape in a key."""
    n = len(values)
    _, offsets_buf, data_buf = values.buffers()[:3]
    if data_buf is None or n == 0:
        return np.zeros(n, dtype=bool)
    width = np.int64 if pa.types.is_large_binary(values.type) else np.int32
    offsets = np.frombuffer(offsets_buf, dtype=width)[values.offset:values.offset + n + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    ok = ends > starts
    idx = np.flatnonzero(ok)
    ok[idx] = (data[starts[idx]] == 0x7B) & (data[ends[idx] - 1] == 0x7D)
    raw = data_buf.to_pybytes()[offsets[0]:offsets[-1]] if data_buf.size else b""
    if raw.find(b"\n") >= 0 or raw.find(b"\r") >= 0:
        span = data[offsets[0]:offsets[-1]]
        breaks = np.flatnonzero((span == 0x0A) | (span == 0x0D))
        ok[np.searchsorted(offsets, breaks + offsets[0], side="right") - 1] = False
    if raw.find(b"\\u") >= 0:
        ok &= ~pc.match_substring_regex(values, _ESCAPE_IN_KEY).to_numpy(zero_copy_only=False)
    try:
        values.cast(pa.string())  # validates UTF-8 in C++; pyarrow's JSON reader does not
    except pa.ArrowInvalid:
        for i, v in enumerate(values.to_pylist()):
            try:
                v.decode("utf-8")
            except UnicodeDecodeError:
                ok[i] = False
    return ok


def _json_type(v) -> str:
    if isinstance(v, dict):  # _Object too (the strict decoder's objects)
        return "object"
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(v), "number")


class _Object(dict):
    """A decoded JSON object that remembers its duplicated keys (pyarrow rejects those of the schema)."""

    __slots__ = ("duplicates",)


def _object_pairs(pairs):
    obj = _Object(pairs)
    if len(obj) == len(pairs):
        obj.duplicates = ()
    else:
        seen: set[str] = set()
        obj.duplicates = {k for k, _ in pairs if k in seen or seen.add(k)}
    return obj


_PLAIN = json.JSONDecoder()
_STRICT = json.JSONDecoder(object_pairs_hook=_object_pairs)


def parse_one(value: bytes) -> tuple[tuple | None, str | None]:
    """Parse and validate one profile value the slow, exact way: (fields, None) or (None, reason).

    Agrees with the pyarrow path: UTF-8 required, unknown fields ignored whatever they hold, a
    profile field given twice is an error.
    """
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"invalid JSON: not UTF-8 at byte {e.start}"
    maybe_twice = "\\u" in text or any(text.count(f'"{f}"') > 1 for f in PROFILE_FIELDS)
    try:
        doc = (_STRICT if maybe_twice else _PLAIN).decode(text)
    except (ValueError, RecursionError) as e:
        return None, f"invalid JSON: {e}"
    if not isinstance(doc, dict):
        return None, f"not a JSON object: {_json_type(doc)}"
    twice = getattr(doc, "duplicates", ())
    for f in PROFILE_FIELDS:  # the first in this order, not the set's (which varies between processes)
        if f in twice:
            return None, f"{f}: given twice"
    out = []
    for f in PROFILE_FIELDS:
        v = doc.get(f)
        if v is None:
            if f == "name":
                return None, "name: missing"
        elif not isinstance(v, str):
            expected = "a string" if f == "name" else "a string or null"
            return None, f"{f}: expected {expected}, got {_json_type(v)}"
        else:
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return None, f"{f}: invalid unicode (lone surrogate)"
        out.append(v)
    return tuple(out), None


def _parse_slow(values: pa.Array, positions: np.ndarray):
    rows, good, errors = [], [], []
    for pos, v in zip(positions.tolist(), values.to_pylist()):
        fields, err = parse_one(v)
        if err:
            errors.append((pos, err))
        else:
            rows.append(fields)
            good.append(pos)
    cols = list(zip(*rows)) if rows else [()] * len(PROFILE_FIELDS)
    table = pa.table([pa.array(c, pa.string()) for c in cols], schema=PROFILE_SCHEMA)
    return np.asarray(good, dtype=np.int64), table, errors


def _parse_fast(values: pa.Array, positions: np.ndarray, pieces: list, errors: list) -> None:
    """pyarrow over all values; at an error, the values before it again, the bad one alone, go on.

    The failing row comes from pyarrow's message and is checked by the retry itself (a prefix
    that fails again goes record by record). Where errors are dense (the next one within
    DENSE_ROWS), a window of SLOW_WINDOW records goes record by record instead: cheaper than a
    pyarrow call per bad record. Either way each failed call consumes records, so this ends.
    """
    def slow(a: int, b: int) -> None:
        good, table, errs = _parse_slow(values.slice(a, b - a), positions[a:b])
        pieces.append((good, table))
        errors.extend(errs)

    lines = _Lines(values)
    start, n = 0, len(values)
    while start < n:
        try:
            pieces.append((positions[start:], lines.read(start, n)))
            return
        except pa.ArrowInvalid as e:
            row = _error_row(e, n - start)
        if row is None:
            return slow(start, n)
        bad = start + row
        if row < DENSE_ROWS:
            end = min(n, bad + 1 + SLOW_WINDOW)
            slow(start, end)
            start = end
            continue
        try:
            pieces.append((positions[start:bad], lines.read(start, bad)))
        except pa.ArrowInvalid:
            slow(start, bad)
        slow(bad, bad + 1)
        start = bad + 1


def _parse_fast_parallel(values: pa.Array, positions: np.ndarray, pieces: list, errors: list) -> None:
    """`_parse_fast` over PARSE_THREADS slices at once (pyarrow parses without the GIL).

    The driver parses while Spark's executors wait for the next micro-batch, so their cores are free.
    """
    n = len(values)
    if n == 0:
        return
    threads = min(PARSE_THREADS, max(1, n // PARSE_MIN_PER_THREAD))
    if threads == 1:
        return _parse_fast(values, positions, pieces, errors)
    bounds = np.linspace(0, n, threads + 1).astype(int)
    results = [([], []) for _ in range(threads)]
    futures = [thread_pool().submit(_parse_fast, values.slice(a, b - a), positions[a:b], *results[i])
               for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    for f in futures:
        f.result()
    for p, e in results:
        pieces += p
        errors += e


_POOL: ThreadPoolExecutor | None = None


def thread_pool() -> ThreadPoolExecutor:
    """The driver's worker threads for parsing slices (and the job's range reads), made once."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="kappa-standardize")
    return _POOL


def parse_profiles(values: pa.Array) -> tuple[np.ndarray, pa.Table, list[tuple[int, str]]]:
    """Parse non-null JSON profile values.

    Returns (positions of the valid values, their parsed fields in that order, [(position, reason)]
    of the others). All well: one pyarrow parse over the whole batch. Values pyarrow cannot take
    line by line (line breaks, not starting with '{', not UTF-8) go record by record; a parse
    error costs one retry (see `_parse_fast`).
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    n = len(values)
    all_pos = np.arange(n, dtype=np.int64)
    if n == 0:
        return all_pos, PROFILE_SCHEMA.empty_table(), []
    fast = _single_line_objects(values)
    pieces: list[tuple[np.ndarray, pa.Table]] = []
    errors: list[tuple[int, str]] = []
    if fast.all():
        fast_pos, fast_values = all_pos, values
    else:
        slow_pos = np.flatnonzero(~fast)
        good, table, errs = _parse_slow(values.take(slow_pos), slow_pos)
        pieces.append((good, table))
        errors += errs
        fast_pos = np.flatnonzero(fast)
        fast_values = values.take(fast_pos)
    _parse_fast_parallel(fast_values, fast_pos, pieces, errors)
    pieces = [p for p in pieces if len(p[0])] or [(all_pos[:0], PROFILE_SCHEMA.empty_table())]
    positions = np.concatenate([p for p, _ in pieces])
    table = pa.concat_tables([t for _, t in pieces]) if len(pieces) > 1 else pieces[0][1]
    # pyarrow reads a missing or null name as null; the slow path rejected those already.
    no_name = table["name"].is_null().to_numpy(zero_copy_only=False)
    if no_name.any():
        errors += [(int(positions[i]), "name: missing") for i in np.flatnonzero(no_name)]
        positions = positions[~no_name]
        table = table.filter(pa.array(~no_name))
    return positions, table, errors


def decode_keys(keys: pa.Array) -> tuple[pa.Array, dict[int, str]]:
    """Kafka keys as UTF-8 strings (null where unusable) and {position: reason} for unusable ones."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    errors: dict[int, str] = {}
    if keys.null_count:
        errors.update((int(i), "no key") for i in np.flatnonzero(keys.is_null().to_numpy(zero_copy_only=False)))
    try:
        return keys.cast(pa.string()), errors
    except pa.ArrowInvalid:
        out = []
        for i, k in enumerate(keys.to_pylist()):
            try:
                out.append(None if k is None else k.decode("utf-8"))
            except UnicodeDecodeError as e:
                out.append(None)
                errors[i] = f"key is not UTF-8 (byte {e.start})"
        return pa.array(out, pa.string()), errors


# --------------------------------------------------------------------------------------------
# The micro-batch transform (pure: Arrow in, Arrow out)
# --------------------------------------------------------------------------------------------

def _col(table: pa.Table, name: str) -> pa.Array:
    c = table[name]
    return c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c


def transform_batch(batch: pa.Table, rules: Rules, batch_id: int) -> BatchResult:
    """One micro-batch of raw Kafka records -> upserts (one row per key, `_deleted`) and rejects.

    `batch` has the source's columns key, value, topic, partition, offset, timestamp.
    """
    t0 = time.perf_counter()
    n = batch.num_rows
    member_id, reasons = decode_keys(_col(batch, "key"))
    values = _col(batch, "value")
    usable = np.ones(n, dtype=bool)
    if reasons:
        usable[list(reasons)] = False
    is_null = values.is_null().to_numpy(zero_copy_only=False)
    tomb_pos = np.flatnonzero(is_null & usable)
    data_pos = np.flatnonzero(~is_null & usable)
    t1 = time.perf_counter()

    good_rel, parsed, errs = parse_profiles(values.take(data_pos) if len(data_pos) < n else values)
    for rel, reason in errs:
        reasons[int(data_pos[rel])] = reason
    good_pos = data_pos[good_rel]
    t2 = time.perf_counter()

    # Latest offset per key among valid records and tombstones, on a slim table; then gather.
    take = np.concatenate([good_pos, tomb_pos])
    offset = _col(batch, "offset").cast(pa.int64())
    slim = pa.table({"member_id": member_id.take(take), "source_offset": offset.take(take),
                     "__i": np.arange(len(take), dtype=np.int64)})
    win = latest_per_key(slim, KEY_COLUMNS, "source_offset")["__i"].to_numpy()
    is_tomb = win >= len(good_pos)
    rows = pa.array(take[win])
    parsed_rows = pa.array(np.where(is_tomb, 0, win), pa.int64(), mask=is_tomb)
    latest = {
        "member_id": member_id.take(rows),
        "name": parsed["name"].take(parsed_rows),
        "title_raw": parsed["title"].take(parsed_rows),
        "company_raw": parsed["company"].take(parsed_rows),
        "location": parsed["location"].take(parsed_rows),
        "source_partition": _col(batch, "partition").cast(pa.int32()).take(rows),
        "source_offset": offset.take(rows),
        "source_timestamp": _col(batch, "timestamp").cast(OUTPUT_SCHEMA.field("source_timestamp").type).take(rows),
        DELETED: pa.array(is_tomb, pa.bool_()),
    }
    t3 = time.perf_counter()

    latest["title"] = rules.standardize_array("titles", latest["title_raw"])
    latest["company"] = rules.standardize_array("companies", latest["company_raw"])
    upserts = pa.table({name: latest[name] for name in [*OUTPUT_SCHEMA.names, DELETED]})
    t4 = time.perf_counter()
    rejects = reject_table(batch, reasons, batch_id)
    return BatchResult(upserts, rejects, n, len(tomb_pos),
                       {"keys": t1 - t0, "parse": t2 - t1, "dedup": t3 - t2, "rules": t4 - t3})


def reject_table(batch: pa.Table, reasons: dict[int, str], batch_id: int) -> pa.Table:
    """Rows of `batch` at the positions in `reasons`, in the rejects table's schema."""
    if not reasons:
        return REJECTS_SCHEMA.empty_table()
    pos = sorted(reasons)
    rows = batch.select(["key", "value", "topic", "partition", "offset"]).take(pa.array(pos, pa.int64()))
    return pa.table({
        "key": rows["key"].cast(pa.binary()),
        "value": rows["value"].cast(pa.binary()),
        "topic": rows["topic"].cast(pa.string()),
        "partition": rows["partition"].cast(pa.int32()),
        "offset": rows["offset"].cast(pa.int64()),
        "error": pa.array([reasons[p] for p in pos], pa.string()),
        "batch_id": pa.array([batch_id] * len(pos), pa.int64()),
    }, schema=REJECTS_SCHEMA)
