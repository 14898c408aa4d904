"""The README's reader examples, run as written: the served table read through the alias pointer file (no
kappa import on the reader's side) with delta-rs's scan, Polars and DuckDB over the scan, before and after
a flip and an upsert that leaves replaced files on disk. (A table with deletion vectors, as the jobs
write them, is read by the same routes in tests/integration/source/test_delta_readers.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
from deltalake import DeltaTable
from rules_helpers import ALIAS, PIPELINE, serve, standardized

ROWS = [("m1", "swe", "acme"), ("m2", "Developer", "Hooli"), ("m3", "pm", None)]


# -- as in the README ---------------------------------------------------------------------------

def served_table(warehouse: str, alias: str) -> str:
    """The location of the table `alias` serves now, from its pointer file."""
    with open(f"{warehouse}/_aliases/{alias}.json") as f:
        return json.load(f)["table"]


def delta_rs_read(warehouse: str) -> pa.Table:
    return pa.table(DeltaTable(served_table(warehouse, "member_profiles_std")).scan(columns=["member_id", "title"]))


def polars_read(warehouse: str) -> pl.DataFrame:
    return pl.read_delta(served_table(warehouse, "member_profiles_std"))


def polars_scan(warehouse: str) -> pl.DataFrame:
    return (pl.scan_delta(served_table(warehouse, "member_profiles_std"))
            .filter(pl.col("title") == "Software Engineer")
            .select("member_id", "title_raw", "company")
            .collect())


def duckdb_read(warehouse: str) -> list[tuple]:
    rows = DeltaTable(served_table(warehouse, "member_profiles_std")).scan()   # noqa: F841 - DuckDB reads it by name
    return duckdb.sql("SELECT member_id, title, company FROM rows ORDER BY member_id").fetchall()


# -- the tests ----------------------------------------------------------------------------------

def test_delta_rs_polars_and_duckdb_read_the_served_table_through_the_pointer(k):
    serve(k, standardized(ROWS, "v1"))
    warehouse = str(k.settings.warehouse)
    want = standardized(ROWS, "v1").sort_by("member_id")
    assert served_table(warehouse, ALIAS) == str(k.paths(PIPELINE, 1).table)

    assert sorted(zip(*delta_rs_read(warehouse).to_pydict().values())) == list(
        zip(want["member_id"].to_pylist(), want["title"].to_pylist()))
    got = polars_read(warehouse).sort("member_id")
    assert got.columns == want.column_names
    assert got.to_arrow().cast(want.schema).equals(want)
    assert polars_scan(warehouse).to_dicts() == [
        {"member_id": "m1", "title_raw": "swe", "company": "Acme Corporation"}]
    assert duckdb_read(warehouse) == list(zip(*(want[c].to_pylist() for c in ("member_id", "title", "company"))))


def test_readers_follow_a_flip_and_see_only_the_live_rows_of_an_upserted_table(k):
    serve(k, standardized(ROWS, "v1"))
    warehouse = str(k.settings.warehouse)
    serve(k, standardized(ROWS, "v2"), rules_version="v2")        # the alias flips to v2
    assert polars_read(warehouse).sort("member_id")["title"].to_list() == \
        ["Software Engineer", "Software Engineer", "Product Manager"]

    # an upsert replaces a file: the old file stays on disk for readers of the old snapshot, and only
    # the Delta log says it is gone; a reader that globbed the folder would read m2 twice
    table = served_table(warehouse, ALIAS)
    update = standardized([("m2", "Senior SWE", "Hooli"), ("m4", "cto", "Initech")], "v2")
    DeltaTable(table).merge(update, "t.member_id = s.member_id", source_alias="s", target_alias="t") \
        .when_matched_update_all().when_not_matched_insert_all().execute()
    on_disk = list(Path(table).rglob("*.parquet"))
    assert len(on_disk) > len(DeltaTable(table).file_uris())
    want = [("m1", "Software Engineer"), ("m2", "Senior Software Engineer"), ("m3", "Product Manager"),
            ("m4", "Chief Technology Officer")]
    assert [(r[0], r[1]) for r in duckdb_read(warehouse)] == want
    assert list(polars_read(warehouse).sort("member_id").select("member_id", "title").iter_rows()) == want
    assert sorted(zip(*delta_rs_read(warehouse).to_pydict().values())) == want
