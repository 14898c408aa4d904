"""The reprocess benchmark's self-check (what it reports about its own output): it passes on the
right output and fails on a wrong one; the standardized columns are not its to check."""

from __future__ import annotations

import pyarrow as pa

from orchestrator.dev.bench import NOT_CHECKED, check_against_generator
from orchestrator.dev.datagen import generate_changelog
from tests.oracle import standardize as oracle


def test_bench_self_check_passes_on_the_right_output_and_fails_on_a_wrong_one(seed):
    changes = list(generate_changelog(3000, 500, seed=seed, malformed_share=0.05, delete_share=0.05))
    right = oracle.expected_table(oracle.as_log(changes), "v2")
    rejects = len(right.rejects)
    assert check_against_generator(right.table, rejects, changes) == {
        "rows": right.table.num_rows, "expected_rows": right.table.num_rows, "raw_columns_match": True,
        "rejects": rejects, "expected_rejects": rejects, "rejects_match": True, "not_checked": NOT_CHECKED}

    i = right.table.schema.get_field_index("title_raw")
    titles = right.table["title_raw"].to_pylist()
    wrong_title = right.table.set_column(i, "title_raw", pa.array(["Janitor", *titles[1:]], pa.string()))
    assert check_against_generator(wrong_title, rejects, changes)["raw_columns_match"] is False
    missing_row = check_against_generator(right.table.slice(1), rejects, changes)
    assert (missing_row["raw_columns_match"], missing_row["rows"], missing_row["expected_rows"]) == (
        False, right.table.num_rows - 1, right.table.num_rows)
    assert check_against_generator(right.table, rejects - 1, changes)["rejects_match"] is False
    # what the rules made of the titles is not checked by the bench (the tests compare it with the golden)
    j = right.table.schema.get_field_index("title")
    other = right.table.set_column(j, "title", pa.array(["Janitor"] * right.table.num_rows, pa.string()))
    assert check_against_generator(other, rejects, changes)["raw_columns_match"] is True
