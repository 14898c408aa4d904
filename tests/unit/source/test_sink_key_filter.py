"""The condition on the table's keys that a small micro-batch's MERGE adds (`jobs.lib.sink.tables._key_filter`):
SQL literals that round-trip any key, and null keys, which the MERGE matches with <=>, kept."""

from __future__ import annotations

from jobs.lib.sink.tables import _key_filter


def test_string_keys_are_quoted_and_escaped_and_sorted_once_each():
    assert _key_filter("t", "member_id", ["m2", "m1", "m2"]) == "(t.`member_id` IN ('m1', 'm2'))"
    assert _key_filter("t", "k", ["o'b", "c\\d"]) == "(t.`k` IN ('c\\\\d', 'o\\'b'))"


def test_a_null_key_is_matched_as_the_merge_matches_it():
    assert _key_filter("t", "k", [None, "a"]) == "(t.`k` IN ('a') OR t.`k` IS NULL)"
    assert _key_filter("t", "k", [None]) == "(t.`k` IS NULL)"


def test_integer_keys_and_keys_of_other_types():
    assert _key_filter("t", "id", [3, 1]) == "(t.`id` IN (1, 3))"
    assert _key_filter("t", "id", [1.5]) is None and _key_filter("t", "id", [True]) is None
