"""Reading a version's Delta tables from the control plane (validation report, rules preview, key
counts, demo, benchmarks), with delta-rs.

The jobs write with delta-spark, whose tables carry deletion vectors: a MERGE marks the rows it
replaces instead of rewriting their files. `DeltaTable.scan` honours them (delta-rs's DataFusion
reader); `to_pyarrow_table` and `to_pyarrow_dataset` refuse such a table, and reading the data
files another way (a Parquet glob, `file_uris()`) would return the replaced rows too. So every read
here goes through `scan`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["is_table", "read_table", "snapshot", "count_rows", "count_rows_from_log", "column_names", "arrow_schema"]


def is_table(uri: str | Path) -> bool:
    from deltalake import DeltaTable

    return DeltaTable.is_deltatable(str(uri))


def _open(uri: str | Path):
    """The table at `uri`, its log read once; None if there is no table there."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(str(uri))
    except TableNotFoundError:
        return None


def read_table(table: Any, columns: list[str] | None = None, predicate: str | None = None):
    """The live rows of a Delta table (a URI or an open `DeltaTable`) as a pyarrow Table."""
    import pyarrow as pa
    from deltalake import DeltaTable

    dt = table if isinstance(table, DeltaTable) else DeltaTable(str(table))
    schema = pa.schema(dt.schema())
    if columns is not None:
        schema = pa.schema([schema.field(c) for c in columns])
    batches = list(dt.scan(columns=columns, predicate=predicate))
    out = pa.Table.from_batches([pa.record_batch(b) for b in batches]) if batches else schema.empty_table()
    return out.cast(schema) if out.schema != schema else out


def snapshot(uri: str | Path):
    """(the live rows as a pyarrow Table, the Delta version they are read at); None if there is no table."""
    dt = _open(uri)
    return None if dt is None else (read_table(dt), dt.version())


def count_rows(uri: str | Path) -> int:
    """Live rows of a Delta table; 0 if there is no table at `uri` (no micro-batch committed yet)."""
    dt = _open(uri)
    return 0 if dt is None else _scan_count(dt)


def _scan_count(dt: Any) -> int:
    first = dt.schema().fields[0].name
    return sum(b.num_rows for b in dt.scan(columns=[first]))


def count_rows_from_log(uri: str | Path) -> int:
    """Rows of an append-only Delta table (a rejects table) from its log alone: the sum of the row
    counts in its data files' statistics, no data read. 0 if there is no table at `uri`.

    A file without statistics is counted by a scan (`count_rows`). Deletion vectors are not seen
    here (delta-rs's add actions leave them out), so a table that a DELETE, UPDATE or MERGE changed
    (an output table) is counted with `count_rows` instead."""
    import pyarrow as pa

    dt = _open(uri)
    if dt is None:
        return 0
    counts = pa.table(dt.get_add_actions()).column("num_records").to_pylist()
    if any(n is None for n in counts):
        return _scan_count(dt)
    return sum(counts)


def column_names(uri: str | Path) -> list[str] | None:
    """The table's columns; None if there is no table at `uri`."""
    dt = _open(uri)
    return None if dt is None else [f.name for f in dt.schema().fields]


def arrow_schema(uri: str | Path):
    """The table's schema as a pyarrow Schema (its log only, no data read); None if there is no table."""
    import pyarrow as pa

    dt = _open(uri)
    return None if dt is None else pa.schema(dt.schema())
