"""The changelog generator (the expected table is the tests' own: test_standardize_oracle.py)."""

from __future__ import annotations

import json
from collections import Counter

from orchestrator.dev.datagen import MALFORMED_KINDS, generate_changelog, member_key
from tests.oracle.standardize import key_reason, standardize, value_reason


def test_generator_is_deterministic_and_has_every_kind_of_record():
    a = list(generate_changelog(20_000, 2_000, seed=4, malformed_share=0.05, delete_share=0.05))
    b = list(generate_changelog(20_000, 2_000, seed=4, malformed_share=0.05, delete_share=0.05))
    c = list(generate_changelog(20_000, 2_000, seed=5, malformed_share=0.05, delete_share=0.05))
    assert a == b and a != c
    kinds = Counter(r.kind for r in a)
    assert set(kinds) == {"upsert", "tombstone", *MALFORMED_KINDS}
    assert 0.03 < kinds["tombstone"] / 18_000 < 0.07
    assert 0.03 < sum(kinds[k] for k in MALFORMED_KINDS) / 18_000 < 0.07
    assert [r.key for r in a[:2000]] == [member_key(i) for i in range(2000)]  # every member created first
    assert all(r.kind == "upsert" for r in a[:2000])
    upserts = [json.loads(r.value) for r in a if r.kind == "upsert"]
    assert any(not r["name"].isascii() for r in upserts) and any(
        r["title"] and not r["title"].isascii() for r in upserts)
    assert all(key_reason(r.key) is None and value_reason(r.value) is None for r in a if r.kind == "upsert")
    assert all(r.key is not None for r in a)      # a compacted topic refuses a record without a key
    assert all(r.value is None for r in a if r.kind == "tombstone")


def test_value_size_pads_to_about_the_target():
    sizes = [len(r.value) for r in generate_changelog(2000, 500, seed=1, value_size=200,
                                                       malformed_share=0, delete_share=0)]
    assert 195 <= sum(sizes) / len(sizes) <= 215


def test_v2_changes_a_visible_share_of_titles():
    recs = [r for r in generate_changelog(20_000, 20_000, seed=2) if r.kind == "upsert"]
    titles = [json.loads(r.value)["title"] for r in recs]
    changed = sum(standardize("titles", t, "v1") != standardize("titles", t, "v2") for t in titles)
    assert 0.15 < changed / len(titles) < 0.6
