"""`kappa bench upsert`: what one live micro-batch of changed keys costs a large Delta table.

In this process, on a local Spark session, no broker (the figure is the table's, not the job's): a
table of `rows` profile rows is written the way the standardize job writes a version's first batch,
then one micro-batch changes `changed` random existing keys through the job's own MERGE
(`jobs.lib.sink.DeltaTables.upsert`, deletion vectors on: the MERGE marks the replaced rows in a
deletion vector and writes only the new rows). Printed: the micro-batch's seconds and the bytes it
added to the table's folder (data files, deletion vectors, log), next to the reference measured in
the same run: a full rewrite of the same rows.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run_upsert_bench", "folder_bytes"]

COLUMNS = ("member_id string, name string, title string, source_partition int, source_offset bigint, "
           "source_timestamp timestamp, _deleted boolean")


def folder_bytes(path: Path) -> int:
    """Bytes of every file under `path`."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def _rows(ids, name: str, offset: int = 0):
    """Profile rows of the ids in the DataFrame `ids` (one column ``id``)."""
    from pyspark.sql import functions as F

    return ids.select(
        F.format_string("m%09d", F.col("id")).alias("member_id"), F.concat(F.lit(f"{name} "), F.col("id")).alias("name"),
        F.lit("Senior Software Engineer").alias("title"), F.lit(0).alias("source_partition"),
        (F.col("id") + offset).alias("source_offset"), F.timestamp_micros(F.col("id") + offset).alias("source_timestamp"),
        F.lit(False).alias("_deleted"))


def _batch(spark, uri: Path, batch_id: int, df) -> dict[str, Any]:
    """One micro-batch through the job's own Delta writes; its seconds and the bytes it added."""
    from jobs.lib.sink import DeltaTables

    before = folder_bytes(uri) if uri.exists() else 0
    tables = DeltaTables(str(uri), None, "kappa.bench.v1", "member_id")
    t0 = time.perf_counter()
    tables.upsert(batch_id, df, "_deleted")
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "bytes_written": folder_bytes(uri) - before}


def run_upsert_bench(rows: int = 2_000_000, changed: int = 1_000, *, seed: int = 7, workdir: Path | None = None,
                     console=None, spark=None) -> dict[str, Any]:
    """Build, then one micro-batch of `changed` keys, then the full rewrite (see the module)."""
    say = console.print if console is not None else (lambda *a, **k: None)
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="kappa-bench-upsert-")) if own else Path(workdir)
    session = spark
    try:
        if session is None:
            from jobs.lib.session import build_session

            say("starting Spark...")
            session = build_session("kappa-bench-upsert", local_dir=str(work / "spark-local"))
        say(f"building a Delta table of {rows:,} rows...")
        build = _batch(session, work / "out", 0, _rows(session.range(rows), "first"))
        picked = sorted(random.Random(seed).sample(range(rows), min(changed, rows)))
        say(f"one micro-batch of {len(picked):,} changed keys...")
        changes = _rows(session.createDataFrame([(i,) for i in picked], "id long"), "changed", offset=rows)
        live = _batch(session, work / "out", 1, changes)
        versions = session.sql(f"DESCRIBE HISTORY delta.`{work / 'out'}`").orderBy("version").collect()
        metrics = versions[-1]["operationMetrics"] or {}
        live["rows_updated"] = int(metrics.get("numTargetRowsUpdated", 0))
        live["deletion_vectors_added"] = int(metrics.get("numTargetDeletionVectorsAdded", 0))
        live["files_rewritten"] = int(metrics.get("numTargetFilesRemoved", 0))
        say("the reference: a full rewrite of the same rows...")
        full = _batch(session, work / "full", 0, _rows(session.range(rows), "first"))
    finally:
        if session is not None and spark is None:
            session.stop()
        if own:
            shutil.rmtree(work, ignore_errors=True)
    figures = {"rows": rows, "changed": len(picked), "build_seconds": build["seconds"], "live": live,
               "full_rewrite": full,
               "ratio_seconds": live["seconds"] / full["seconds"] if full["seconds"] else None,
               "ratio_bytes": live["bytes_written"] / full["bytes_written"] if full["bytes_written"] else None}
    say(f"micro-batch of {figures['changed']:,} changed keys into {rows:,} rows: {live['seconds']:.2f} s, "
        f"{live['rows_updated']:,} rows updated, {live['deletion_vectors_added']} deletion vectors added, "
        f"{live['files_rewritten']} files rewritten, {live['bytes_written']:,} bytes written")
    say(f"full rewrite (reference): {full['seconds']:.2f} s, {full['bytes_written']:,} bytes written; ratio "
        f"{figures['ratio_seconds']:.2f} of its time, {figures['ratio_bytes']:.3f} of its bytes")
    return figures
