"""The standardize job's expected output, computed by the tests alone.

Nothing here imports `jobs` (or orchestrator code that does), so a wrong title mapping, column
type or reject reason in the product cannot appear on both sides of an equality test:

- the output schema is written out below;
- titles and companies come from `golden_standardize.json`, a mapping from every spelling the
  changelog generator emits to its value under the rules v1 and v2, written by hand from the rules
  files (a spelling missing from it is an error, not a guess);
- profile values are parsed with the standard library's `json`, and every reject reason is
  spelled here.

The semantics, as the job documents them: the latest valid record per key in log order wins,
a tombstone (null value) removes the key, a malformed record goes to the rejects and leaves the
key as it was. A profile is a JSON object with a string `name`; `title`, `company`, `location`
and `updated_at` are strings or null; other fields are ignored whatever they hold. A profile field
given twice is ambiguous and rejected, naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Iterable

import pyarrow as pa

__all__ = ["OUTPUT_SCHEMA", "PROFILE_FIELDS", "GOLDEN_PATH", "RULES_VERSIONS", "golden", "standardize",
           "key_reason", "parse_profile", "value_reason", "Expected", "expected_table", "as_log"]

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
PROFILE_FIELDS = ("name", "title", "company", "location", "updated_at")
GOLDEN_PATH = Path(__file__).with_name("golden_standardize.json")
RULES_VERSIONS = ("v1", "v2")


@cache
def golden(section: str) -> dict[str | None, dict[str, str | None]]:
    """raw spelling -> {"v1": value, "v2": value} for section "titles" or "companies"."""
    entries = json.loads(GOLDEN_PATH.read_text(encoding="utf-8"))[section]
    out = {e["raw"]: {v: e[v] for v in RULES_VERSIONS} for e in entries}
    assert len(out) == len(entries), f"{GOLDEN_PATH}: a {section} spelling is listed twice"
    return out


def standardize(section: str, raw: str | None, rules_version: str) -> str | None:
    """What the rules `rules_version` make of `raw`, from the golden file only."""
    try:
        return golden(section)[raw][rules_version]
    except KeyError:
        raise LookupError(f"{GOLDEN_PATH.name} has no {section} entry for {raw!r} under {rules_version!r}: "
                          f"add one, worked out from jobs/rules/titles/{rules_version}.toml by hand") from None


def key_reason(key: bytes | None) -> str | None:
    """Why a Kafka key cannot be a member id, or None when it can."""
    if key is None:
        return "no key"
    try:
        key.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"key is not UTF-8 (byte {e.start})"
    return None


class _Doc(dict):
    """A JSON object with the keys it had more than once, in the order they came back."""

    repeated: list[str]


def _pairs(pairs: list[tuple[str, object]]) -> _Doc:
    doc = _Doc()
    doc.repeated = []
    for k, v in pairs:
        if k in doc and k not in doc.repeated:
            doc.repeated.append(k)
        doc[k] = v
    return doc


def _type_name(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    return "string" if isinstance(v, str) else "array" if isinstance(v, list) else "object"


def parse_profile(value: bytes) -> tuple[dict | None, str | None]:
    """(profile fields, None) for a usable value, (None, the exact reject reason) otherwise."""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"invalid JSON: not UTF-8 at byte {e.start}"
    try:
        doc = json.loads(text, object_pairs_hook=_pairs)
    except ValueError as e:
        return None, f"invalid JSON: {e}"
    if not isinstance(doc, dict):
        return None, f"not a JSON object: {_type_name(doc)}"
    for f in PROFILE_FIELDS:  # ambiguous before anything else, first field in PROFILE_FIELDS order
        if f in doc.repeated:
            return None, f"{f}: given twice"
    for f in PROFILE_FIELDS:
        v = doc.get(f)
        if v is None and f == "name":
            return None, "name: missing"
        if v is not None and not isinstance(v, str):
            return None, f"{f}: expected {'a string' if f == 'name' else 'a string or null'}, got {_type_name(v)}"
        if isinstance(v, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in v):
            return None, f"{f}: invalid unicode (lone surrogate)"
    return {f: doc.get(f) for f in PROFILE_FIELDS}, None


def value_reason(value: bytes) -> str | None:
    """The exact reject reason of a non-null value, or None when it is a usable profile."""
    return parse_profile(value)[1]


@dataclass
class Expected:
    table: pa.Table                        # in OUTPUT_SCHEMA, sorted by member_id
    rejects: list[tuple[int, int, str]]    # (partition, offset, reason), in log order
    records: int


def expected_table(log: Iterable, rules_version: str) -> Expected:
    """The standardize output and rejects for `log` under the rules `rules_version` ("v1" or "v2").

    `log`: records with key, value, partition, offset, timestamp_ms (e.g. datagen.LogRecord), each
    partition's in offset order (a key lives in one partition, so that is log order per key).
    """
    latest: dict[str, tuple] = {}
    rejects: list[tuple[int, int, str]] = []
    n = 0
    for rec in log:
        n += 1
        reason = key_reason(rec.key)
        if reason is None and rec.value is not None:
            profile, reason = parse_profile(rec.value)
        if reason is not None:
            rejects.append((rec.partition, rec.offset, reason))
        elif rec.value is None:
            latest.pop(rec.key.decode("utf-8"), None)
        else:
            latest[rec.key.decode("utf-8")] = (rec.partition, rec.offset, rec.timestamp_ms, profile)
    rows = []
    for key in sorted(latest):
        part, off, ts, p = latest[key]
        rows.append({
            "member_id": key, "name": p["name"],
            "title_raw": p["title"], "title": standardize("titles", p["title"], rules_version),
            "company_raw": p["company"], "company": standardize("companies", p["company"], rules_version),
            "location": p["location"], "source_partition": part, "source_offset": off,
            "source_timestamp": ts * 1000,
        })
    columns = {f.name: pa.array([r[f.name] for r in rows], f.type) for f in OUTPUT_SCHEMA}
    return Expected(pa.table(columns, schema=OUTPUT_SCHEMA), rejects, n)


def as_log(changes: Iterable, partitions: int = 4, first_timestamp_ms: int = 1_700_000_000_000) -> list:
    """The generator's records as a fresh `partitions`-partition topic holds them (the partition
    `datagen.partition_for` picks, offsets from 0 per partition, a millisecond apart)."""
    from orchestrator.dev.datagen import LogRecord, partition_for

    log, next_offset = [], [0] * partitions
    for i, rec in enumerate(changes):
        p = partition_for(rec.key, partitions, i)
        log.append(LogRecord(rec.key, rec.value, p, next_offset[p], first_timestamp_ms + i))
        next_offset[p] += 1
    return log
