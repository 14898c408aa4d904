"""`kappa bench upsert`: what one live micro-batch of changed keys costs a large bucketed table.

In this process, no broker and no Spark (the figure is the table's, not the job's): a bucketed
table of `rows` profile rows is built the way the standardize job builds it (`merge_bucket` per
bucket, one `create_write_transaction`), then one micro-batch changes `changed` random existing
keys. Printed: seconds and bytes rewritten by that micro-batch, buckets touched, next to the
reference measured in the same run: a full rewrite of the same rows (every bucket's file written
again). With keys spread by hash, a batch touches about ``buckets * (1 - (1 - 1/buckets)**changed)``
buckets: more buckets, less rewritten per batch, more files.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

__all__ = ["run_upsert_bench", "profile_rows"]

SCHEMA = pa.schema([("member_id", pa.string()), ("name", pa.string()), ("title", pa.string()),
                    ("source_partition", pa.int32()), ("source_offset", pa.int64()),
                    ("source_timestamp", pa.timestamp("us", tz="UTC"))])


def profile_rows(keys: list[str], offset: int, name: str) -> pa.Table:
    n = len(keys)
    return pa.table({"member_id": keys, "name": [f"{name} {k}" for k in keys],
                     "title": ["Senior Software Engineer"] * n, "source_partition": pa.array([0] * n, pa.int32()),
                     "source_offset": pa.array(range(offset, offset + n), pa.int64()),
                     "source_timestamp": pa.array(range(offset, offset + n), pa.timestamp("us", tz="UTC")),
                     "_deleted": [False] * n})


def _batch(table, batch_id: int, rows: pa.Table) -> dict[str, Any]:
    """One micro-batch through the job's own merge task, in this process."""
    import numpy as np
    import pyarrow.ipc as ipc

    from jobs.lib.bucketed.tasks import StageSpec, bucket_of, merge_bucket, staged_path

    spec = StageSpec(table_uri=table.table_uri, rejects_uri=None, staging_uri=f"{table.staging_root}/batch-{batch_id}",
                     batch_id=batch_id, buckets=table.buckets, key_column="member_id", settings=None, transform=None,
                     output_schema=table.schema)
    t0 = time.perf_counter()
    buckets = bucket_of(rows["member_id"], table.buckets)
    staged: dict[int, list[str]] = {}
    for b in np.unique(buckets):
        path = staged_path(spec.staging_uri, int(b), "bench", 0, batch_id)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        part = rows.filter(pa.array(buckets == b))
        with ipc.new_file(path, part.schema) as w:
            w.write_table(part)
        staged[int(b)] = [path]
    current = table.current_files(set(staged))
    merged = [merge_bucket(spec, b, staged[b], current[b]) for b in sorted(staged)]
    table.commit(batch_id, [m["add"] for m in merged if m["add"]], [r for m in merged for r in m["remove"]],
                 {"bench": {"0": batch_id + 1}})
    table.drop_staging(spec.staging_uri)
    return {"seconds": time.perf_counter() - t0, "buckets": len(merged),
            "bytes_rewritten": sum(m.get("rewritten_bytes", 0) for m in merged),
            "bytes_written": sum(m["add"]["size"] for m in merged if m["add"])}


def run_upsert_bench(rows: int = 2_000_000, changed: int = 1_000, buckets: int = 32, *, seed: int = 7,
                     workdir: Path | None = None, console=None) -> dict[str, Any]:
    """Build, then one micro-batch of `changed` keys, then the full rewrite (see the module)."""
    from jobs.lib.bucketed.table import BucketedTable

    say = console.print if console is not None else (lambda *a, **k: None)
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="kappa-bench-upsert-")) if own else Path(workdir)
    try:
        table = BucketedTable(str(work / "out"), None, "kappa.bench.v1", SCHEMA, buckets=buckets)
        table.ensure()
        keys = [f"m{i:09d}" for i in range(rows)]
        say(f"building a bucketed table of {rows:,} rows in {buckets} buckets...")
        build = _batch(table, 0, profile_rows(keys, 0, "first"))
        changed_keys = sorted(random.Random(seed).sample(keys, min(changed, rows)))
        say(f"one micro-batch of {len(changed_keys):,} changed keys...")
        live = _batch(table, 1, profile_rows(changed_keys, rows, "changed"))
        say("the reference: a full rewrite of the same rows...")
        full_table = BucketedTable(str(work / "full"), None, "kappa.bench.v1", SCHEMA, buckets=buckets)
        full_table.ensure()
        full = _batch(full_table, 0, profile_rows(keys, 0, "first"))
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    figures = {"rows": rows, "changed": len(changed_keys), "buckets": buckets, "build_seconds": build["seconds"],
               "live": live, "full_rewrite": full,
               "ratio_seconds": live["seconds"] / full["seconds"] if full["seconds"] else None,
               "ratio_bytes": live["bytes_written"] / full["bytes_written"] if full["bytes_written"] else None}
    say(f"micro-batch of {figures['changed']:,} changed keys into {rows:,} rows: {live['seconds']:.2f} s, "
        f"{live['buckets']} of {buckets} buckets rewritten, {live['bytes_rewritten']:,} bytes replaced, "
        f"{live['bytes_written']:,} written")
    say(f"full rewrite (reference): {full['seconds']:.2f} s, {full['bytes_written']:,} bytes written; ratio "
        f"{figures['ratio_seconds']:.2f} of its time, {figures['ratio_bytes']:.2f} of its bytes")
    return figures
