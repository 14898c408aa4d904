"""A Delta table that delta-spark has merged into, deletion vectors and all, reads the same in every
reader the README shows: Spark with Delta, delta-rs and Polars. The connector JARs come from the
setup's Maven fetch (`jobs.lib.runtime.session.connector_jars`), so this also proves they load."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

ROWS = 2_000


def _rows(spark_rows) -> list[tuple]:
    return sorted(tuple(r) for r in spark_rows)


def test_a_table_merged_by_delta_spark_with_deletion_vectors_reads_the_same_everywhere(spark, tmp_path):
    table = str(tmp_path / "profiles")
    # written first the way kappa's jobs write today (delta-rs), so Spark opens a table it did not make
    write_deltalake(table, pa.table({"member_id": [f"m{i:05d}" for i in range(ROWS)],
                                     "title": ["swe"] * ROWS, "views": list(range(ROWS))}))
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    changes = spark.createDataFrame([(f"m{i:05d}", "Software Engineer", -i, i % 10 == 0)
                                     for i in range(0, ROWS, 7)],
                                    "member_id string, title string, views bigint, deleted boolean")
    changes.createOrReplaceTempView("changes")
    spark.sql(f"""MERGE INTO delta.`{table}` t USING changes s ON t.member_id = s.member_id
                  WHEN MATCHED AND s.deleted THEN DELETE
                  WHEN MATCHED THEN UPDATE SET t.title = s.title, t.views = s.views""")

    log = [json.loads(line) for f in sorted(Path(table, "_delta_log").glob("*.json")) for line in f.open()]
    removed_with_dv = [a["add"] for a in log if "add" in a and a["add"].get("deletionVector")]
    assert removed_with_dv, "the MERGE rewrote files instead of marking rows with a deletion vector"

    want = _rows(spark.read.format("delta").load(table).collect())
    deleted = {f"m{i:05d}" for i in range(0, ROWS, 70)}
    assert len(want) == ROWS - len(deleted) and not deleted & {r[0] for r in want}
    assert ("m00007", "Software Engineer", -7) in want and ("m00001", "swe", 1) in want

    # delta-rs: scan() honours deletion vectors; to_pyarrow_table() refuses such a table
    scanned = pa.table(DeltaTable(table).scan(columns=["member_id", "title", "views"]))
    assert _rows(tuple(r.values()) for r in scanned.to_pylist()) == want
    assert _rows(pl.read_delta(table).iter_rows()) == want
