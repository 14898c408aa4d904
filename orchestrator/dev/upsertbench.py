"""`kappa bench upsert`: what a live micro-batch of changed keys costs a large Delta table.

In this process, on a local Spark session, no broker (the figure is the table's, not the job's): a
table of `rows` profile rows is written the way the standardize job writes a version's first batch
(a plain append into the empty table), then `batches` live micro-batches each change `changed`
random existing keys through the job's own MERGE (`jobs.lib.sink.tables.DeltaTables.upsert`, deletion
vectors on: the MERGE marks the replaced rows in a deletion vector and writes only the new rows),
one after the other as a live job runs them. Printed for each: its seconds, Spark jobs, executor CPU
seconds, the files it touched of the files in the table, and the bytes it added (data files, deletion
vectors, log); then the first batch (a fresh JVM compiles Delta's MERGE on it) and the median of the
others (what a running job pays), next to two references measured in the same run: a full rewrite of
the same rows, and Delta's own MERGE as its examples write it (``whenMatchedUpdateAll`` /
``whenNotMatchedInsertAll`` on the key, no kappa code) over a copy of the same table, each of its
batches run right after kappa's batch with the same keys. Its ratio says what kappa's MERGE adds to
Delta's (the tombstones' delete, the key-order check, the idempotent commit, the key filter).
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run_upsert_bench", "folder_bytes", "upsert_lines"]

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


def _kappa_write(uri: Path, batch_id: int, df, rows: int) -> None:
    """The job's own Delta write of one micro-batch (`DeltaTables.upsert`)."""
    from jobs.lib.sink.tables import DeltaTables

    DeltaTables(str(uri), None, "kappa.bench.v1", "member_id").upsert(batch_id, df, "_deleted", rows=rows)


def _plain_write(uri: Path, batch_id: int, df, rows: int) -> None:
    """Delta's MERGE as its examples write it: update or insert every row on the key, nothing else."""
    from delta.tables import DeltaTable

    (DeltaTable.forPath(df.sparkSession, str(uri)).alias("t")
     .merge(df.drop("_deleted").alias("s"), "t.member_id = s.member_id")
     .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())


def _batch(spark, uri: Path, batch_id: int, df, rows: int, write=_kappa_write) -> dict[str, Any]:
    """One micro-batch through `write` (the job's own Delta writes by default): its seconds, Spark jobs,
    executor CPU and the bytes it added."""
    from jobs.lib.runtime.sparkwork import executor_time

    before = folder_bytes(uri) if uri.exists() else 0
    sc = spark.sparkContext
    group = f"kappa-bench-upsert-{uri.name}-{batch_id}"
    sc.setJobGroup(group, f"kappa bench upsert: micro-batch {batch_id}")
    cpu0 = executor_time(spark)
    t0 = time.perf_counter()
    write(uri, batch_id, df, rows)
    seconds = time.perf_counter() - t0
    cpu = executor_time(spark)
    sc.setLocalProperty("spark.jobGroup.id", None)
    return {"seconds": round(seconds, 3), "bytes_written": folder_bytes(uri) - before,
            "spark_jobs": len(sc.statusTracker().getJobIdsForGroup(group)),
            "executor_cpu_seconds": cpu.since(cpu0).cpu_seconds if cpu and cpu0 else None}


def _metrics(session, uri: Path) -> dict[str, Any]:
    """What the table's last commit did, and how many files the table has now."""
    from delta.tables import DeltaTable

    last = DeltaTable.forPath(session, str(uri)).history(1).collect()[0]
    m = last["operationMetrics"] or {}
    files = DeltaTable.forPath(session, str(uri)).detail().collect()[0]["numFiles"]
    return {"rows_updated": int(m.get("numTargetRowsUpdated", 0)),
            "deletion_vectors_added": int(m.get("numTargetDeletionVectorsAdded", 0)),
            "files_rewritten": int(m.get("numTargetFilesRemoved", 0)),
            "files_touched": int(m.get("numTargetDeletionVectorsAdded", 0)) + int(m.get("numTargetFilesRemoved", 0)),
            "files_in_table": int(files)}


def run_upsert_bench(rows: int = 2_000_000, changed: int = 1_000, *, batches: int = 5, seed: int = 7,
                     workdir: Path | None = None, console=None, spark=None) -> dict[str, Any]:
    """Build, then `batches` micro-batches of `changed` keys, then the full rewrite (see the module)."""
    say = console.print if console is not None else (lambda *a, **k: None)
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="kappa-bench-upsert-")) if own else Path(workdir)
    session = spark
    live: list[dict[str, Any]] = []
    plain: list[dict[str, Any]] = []
    try:
        if session is None:
            from jobs.lib.runtime.session import build_session

            say("starting Spark...")
            session = build_session("kappa-bench-upsert", local_dir=str(work / "spark-local"))
        say(f"building a Delta table of {rows:,} rows...")
        build = _batch(session, work / "out", 0, _rows(session.range(rows), "first"), rows)
        shutil.copytree(work / "out", work / "plain")        # the same files and log (its paths are relative)
        rng = random.Random(seed)
        for n in range(1, batches + 1):
            picked = sorted(rng.sample(range(rows), min(changed, rows)))
            changes = _rows(session.createDataFrame([(i,) for i in picked], "id long"), f"changed {n}",
                            offset=rows * n)
            one = {**_batch(session, work / "out", n, changes, len(picked)), **_metrics(session, work / "out")}
            live.append(one)
            say(f"micro-batch {n} of {len(picked):,} changed keys: {one['seconds']:.2f} s, {one['spark_jobs']} Spark "
                f"jobs, executor CPU {one['executor_cpu_seconds'] or 0:.2f} s, {one['files_touched']} of "
                f"{one['files_in_table']} files touched, {one['bytes_written']:,} bytes written")
            ref = {**_batch(session, work / "plain", n, changes, len(picked), _plain_write),
                   **_metrics(session, work / "plain")}
            plain.append(ref)
            say(f"  Delta's plain MERGE of the same keys (reference): {ref['seconds']:.2f} s, {ref['spark_jobs']} "
                f"Spark jobs, executor CPU {ref['executor_cpu_seconds'] or 0:.2f} s, {ref['files_touched']} of "
                f"{ref['files_in_table']} files touched")
        say("the reference: a full rewrite of the same rows...")
        full = _batch(session, work / "full", 0, _rows(session.range(rows), "first"), rows)
    finally:
        if session is not None and spark is None:
            session.stop()
        if own:
            shutil.rmtree(work, ignore_errors=True)
    rest = live[1:] or live
    keys = ("seconds", "spark_jobs", "bytes_written", "executor_cpu_seconds")
    steady = {k: statistics.median(b[k] or 0 for b in rest) for k in keys}
    plain_steady = {k: statistics.median(b[k] or 0 for b in (plain[1:] or plain)) for k in keys}
    figures = {"rows": rows, "changed": min(changed, rows), "batches": len(live), "build_seconds": build["seconds"],
               "live": live, "first": live[0], "steady": steady, "full_rewrite": full,
               "plain": plain, "plain_steady": plain_steady,
               "ratio_plain": plain_steady["seconds"] / steady["seconds"] if steady["seconds"] else None,
               "ratio_seconds": steady["seconds"] / full["seconds"] if full["seconds"] else None,
               "ratio_bytes": steady["bytes_written"] / full["bytes_written"] if full["bytes_written"] else None}
    for line in upsert_lines(figures):
        say(line)
    return figures


def upsert_lines(f: dict[str, Any]) -> list[str]:
    """The summary lines (pure: tested)."""
    first, steady, full, plain = f["first"], f["steady"], f["full_rewrite"], f["plain_steady"]
    return [f"{f['batches']} micro-batches of {f['changed']:,} changed keys into {f['rows']:,} rows: the first "
            f"{first['seconds']:.2f} s ({first['spark_jobs']} Spark jobs; a fresh JVM compiles the MERGE), then a "
            f"median of {steady['seconds']:.2f} s ({steady['spark_jobs']:g} Spark jobs, {steady['bytes_written']:,.0f} "
            f"bytes written); files touched per batch: {', '.join(str(b['files_touched']) for b in f['live'])} of "
            f"{f['live'][-1]['files_in_table']}",
            f"full rewrite (reference): {full['seconds']:.2f} s, {full['bytes_written']:,} bytes written; the median "
            f"micro-batch is {f['ratio_seconds']:.2f} of its time and {f['ratio_bytes']:.4f} of its bytes",
            f"Delta's plain MERGE of the same keys (reference): a median of {plain['seconds']:.2f} s ({plain['spark_jobs']:g} "
            f"Spark jobs, executor CPU {plain['executor_cpu_seconds']:.2f} s) against kappa's {steady['seconds']:.2f} s "
            f"({steady['spark_jobs']:g} jobs, {steady['executor_cpu_seconds']:.2f} s): kappa runs at "
            f"{f['ratio_plain']:.2f} of Delta's own speed"]
