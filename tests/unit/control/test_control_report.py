"""The validation report's table comparison (pyarrow join on the key)."""

from __future__ import annotations

import pyarrow as pa

from orchestrator.lifecycle.report import compare_tables


def _t(rows):
    ids, raw, title, name, off = zip(*rows)
    return pa.table({"member_id": list(ids), "title_raw": list(raw), "title": list(title), "name": list(name),
                     "source_offset": list(off)})


def test_changes_are_attributed_to_the_rules_only_when_the_input_is_equal():
    old = _t([("m1", "swe", "SWE", "Ada", 1), ("m2", "sr swe", "Sr SWE", "Bo", 2), ("m3", "dev", "Dev", "Cy", 3),
              ("m4", "pm", "PM", "Di", 4), ("m5", "x", None, "Ed", 5)])
    new = _t([("m1", "swe", "Software Engineer", "Ada", 10), ("m2", "sr swe", "Senior SWE", "Bo", 2),
              ("m3", "developer", "Developer", "Cy", 9),   # the input changed: not the rules
              ("m4", "pm", "PM", "Di", 4), ("m5", "x", "X", "Ed", 5), ("m6", "pm", "PM", "Fa", 6)])
    d = compare_tables(new, old, ["member_id"])
    assert d["compared_columns"] == ["title"]
    assert d["input_columns"] == ["title_raw", "name"]
    assert (d["rows_compared"], d["rows_changed"], d["rows_input_differs"]) == (5, 3, 1)
    assert (d["keys_only_new"], d["keys_only_serving"]) == (1, 0)
    assert d["top_changes"]["title"] == [{"old": "SWE", "new": "Software Engineer", "count": 1},
                                         {"old": "Sr SWE", "new": "Senior SWE", "count": 1},
                                         {"old": None, "new": "X", "count": 1}]  # equal counts: by old value, null last


def test_top_changes_are_counted_and_ordered():
    old = _t([(f"m{i}", "swe", "SWE", "n", i) for i in range(5)] + [("x1", "dev", "Dev", "n", 9)])
    new = _t([(f"m{i}", "swe", "Software Engineer", "n", i) for i in range(5)] + [("x1", "dev", "Developer", "n", 9)])
    d = compare_tables(new, old, ["member_id"], top=1)
    assert d["changed_by_column"] == {"title": 6}
    assert d["top_changes"]["title"] == [{"old": "SWE", "new": "Software Engineer", "count": 5}]


def test_without_raw_columns_every_common_column_is_compared():
    old = pa.table({"k": [1, 2], "v": ["a", "b"], "_deleted": [False, False]})
    new = pa.table({"k": [1, 2], "v": ["a", "c"], "_deleted": [False, False]})
    d = compare_tables(new, old, ["k"])
    assert d["compared_columns"] == ["v"] and d["rows_changed"] == 1
