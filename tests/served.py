"""What a standardize version serves, compared exactly with the oracle (tests/oracle/standardize.py).

Exactly: the served table's schema (column names and order, types, nullability) equals the
oracle's literal schema, and its rows, sorted by key, equal the expected rows; no column is
dropped and nothing is cast. The version's rejects table holds every malformed record of the log
once, with its raw key and value, its position and its full reason, in a literal schema too.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from orchestrator.core.tables import read_table
from tests.oracle.standardize import Expected, expected_table

__all__ = ["REJECTS_SCHEMA", "expected_from_log", "rejects_diff", "schema_diff", "served_diff", "table_diff"]

#: The rejects table as the tests expect it (batch_id: the micro-batch that met the record).
REJECTS_SCHEMA = pa.schema([
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("error", pa.string()),
    ("batch_id", pa.int64()),
])


def schema_diff(got: pa.Schema, expected: pa.Schema, what: str = "served") -> str | None:
    """None when the schemas are equal field by field (name, type, nullability, order)."""
    if got.equals(expected):
        return None
    if got.names != expected.names:
        return f"{what} columns {got.names} are not the expected {expected.names}"
    spell = lambda f: f"{f.type}{'' if f.nullable else ' not null'}"  # noqa: E731
    return f"{what} schema differs: " + "; ".join(f"{g.name} is {spell(g)}, expected {spell(e)}"
                                                   for g, e in zip(got, expected) if not g.equals(e))


def table_diff(got: pa.Table, expected: pa.Table, key: str = "member_id") -> str | None:
    """None when `got`, sorted by `key`, equals `expected` (sorted by `key`) schema and rows; else what differs."""
    why = schema_diff(got.schema, expected.schema)
    if why:
        return why
    got = got.sort_by(key)
    if got.equals(expected):
        return None
    exp_keys, got_keys = expected[key].to_pylist(), got[key].to_pylist()
    diff: dict = {"missing": sorted(set(exp_keys) - set(got_keys))[:5],
                  "extra": sorted(set(got_keys) - set(exp_keys))[:5]}
    if len(got_keys) != len(set(got_keys)):
        diff["duplicate keys"] = sorted({k for k in got_keys if got_keys.count(k) > 1})[:5]
    if exp_keys == got_keys:
        for name in expected.column_names:
            pairs = zip(got_keys, got[name].to_pylist(), expected[name].to_pylist())
            wrong = [(k, g, e) for k, g, e in pairs if g != e][:3]
            if wrong:
                diff[name] = wrong   # (key, served, expected)
    return f"served {got.num_rows} rows, expected {expected.num_rows}: {diff}"


def expected_from_log(bootstrap: str, topic: str, rules_version: str) -> tuple[Expected, dict]:
    """The oracle's table and rejects for the topic as it is now, and its records by (partition, offset)."""
    from orchestrator.dev.datagen import iter_log

    log = list(iter_log(bootstrap, topic))
    return expected_table(log, rules_version), {(r.partition, r.offset): r for r in log}


def rejects_diff(rejects: pa.Table, expected: Expected, log: dict, topic: str) -> str | None:
    """None when the rejects table holds exactly the oracle's rejects (full reasons, raw records)."""
    why = schema_diff(rejects.schema, REJECTS_SCHEMA, "rejects")
    if why:
        return why
    got = [{k: v for k, v in r.items() if k != "batch_id"} for r in rejects.to_pylist()]
    by_position = {(r["partition"], r["offset"]): r for r in got}
    if len(by_position) != len(got):
        return f"{len(got) - len(by_position)} rejects are recorded twice"
    want = {(p, o): {"key": log[p, o].key, "value": log[p, o].value, "topic": topic, "partition": p, "offset": o,
                     "error": reason} for p, o, reason in expected.rejects}
    if by_position == want:
        return None
    diff = {"missing": sorted(want.keys() - by_position.keys())[:5],
            "extra": sorted(by_position.keys() - want.keys())[:5],
            "different": [(pos, by_position[pos], want[pos]) for pos in sorted(want.keys() & by_position.keys())
                          if by_position[pos] != want[pos]][:3]}
    return f"{len(got)} rejects, expected {len(want)}: {diff}"


def served_diff(settings, alias: str, bootstrap: str, topic: str, rules_version: str,
                rejects_path: Path | None = None) -> tuple[str | None, int]:
    """(None or what differs, rows served) for the table `alias` serves (through its pointer file)
    against the oracle under `rules_version`; with `rejects_path`, that rejects table too."""
    from orchestrator.serving import open_alias

    expected, log = expected_from_log(bootstrap, topic, rules_version)
    served = read_table(open_alias(alias, settings))
    why = table_diff(served, expected.table)
    if why is None and rejects_path is not None:
        why = rejects_diff(read_table(str(rejects_path)), expected, log, topic)
    return why, served.num_rows


def version_diff(table_path: str, rejects_path: str, bootstrap: str, topic: str,
                 rules_version: str) -> tuple[str | None, int]:
    """(None or what differs, rows) for one version's own table and rejects (not through an alias)
    against the oracle under `rules_version`."""
    expected, log = expected_from_log(bootstrap, topic, rules_version)
    got = read_table(table_path)
    why = table_diff(got, expected.table) or rejects_diff(read_table(rejects_path),
                                                         expected, log, topic)
    return why, got.num_rows
