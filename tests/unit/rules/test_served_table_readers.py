"""The README's reader examples, run as written: the served table read from Polars and from DuckDB through
the alias pointer file (no kappa import on the reader's side), before and after a flip and an upsert."""

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


def polars_read(warehouse: str) -> pl.DataFrame:
    return pl.read_delta(served_table(warehouse, "member_profiles_std"))


def polars_scan(warehouse: str) -> pl.DataFrame:
    return (pl.scan_delta(served_table(warehouse, "member_profiles_std"))
            .filter(pl.col("title") == "Software Engineer")
            .select("member_id", "title_raw", "company")
            .collect())


def duckdb_read(warehouse: str) -> list[tuple]:
    files = DeltaTable(served_table(warehouse, "member_profiles_std")).file_uris()
    con = duckdb.connect()
    con.register("profiles", con.read_parquet(files, hive_partitioning=True))
    return con.sql("SELECT member_id, title, company, key_bucket FROM profiles ORDER BY member_id").fetchall()


# -- the tests ----------------------------------------------------------------------------------

def expected(rows, rules_version: str) -> pa.Table:
    return standardized(rows, rules_version).sort_by("member_id")


def test_polars_and_duckdb_read_the_served_table_through_the_pointer(k):
    serve(k, standardized(ROWS, "v1"))
    warehouse = str(k.settings.warehouse)
    want = expected(ROWS, "v1")
    assert served_table(warehouse, ALIAS) == str(k.paths(PIPELINE, 1).table)

    got = polars_read(warehouse).sort("member_id")
    assert got.columns == want.column_names
    assert got.drop("key_bucket").to_arrow().cast(want.drop_columns(["key_bucket"]).schema) \
        .equals(want.drop_columns(["key_bucket"]))
    assert got["key_bucket"].to_list() == want["key_bucket"].to_pylist()
    assert polars_scan(warehouse).to_dicts() == [
        {"member_id": "m1", "title_raw": "swe", "company": "Acme Corporation"}]
    assert duckdb_read(warehouse) == list(zip(*(want[c].to_pylist() for c in
                                                ("member_id", "title", "company", "key_bucket"))))


def test_readers_follow_a_flip_and_see_only_the_live_files_of_an_upserted_table(k):
    serve(k, standardized(ROWS, "v1"))
    warehouse = str(k.settings.warehouse)
    serve(k, standardized(ROWS, "v2"), rules_version="v2")        # the alias flips to v2
    assert polars_read(warehouse).sort("member_id")["title"].to_list() == \
        ["Software Engineer", "Software Engineer", "Product Manager"]

    # an upsert rewrites a bucket's file: the old file stays on disk for readers of the old snapshot,
    # and only the Delta log says it is gone; a reader that globbed the folder would read m2 twice
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
