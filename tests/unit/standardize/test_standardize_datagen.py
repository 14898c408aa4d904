"""The changelog generator and the independent expected-table computation."""

from __future__ import annotations

import json
from collections import Counter

from jobs.lib.rules import load_rules, rules_path
from orchestrator.dev.datagen import (
    MALFORMED_KINDS,
    LogRecord,
    expected_table,
    generate_changelog,
    member_key,
    validate_value,
)

V1 = load_rules(rules_path("titles", "v1"))
V2 = load_rules(rules_path("titles", "v2"))


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
    assert all(validate_value(r.value)[1] is None for r in a if r.kind == "upsert")
    assert all(r.key is None for r in a if r.kind == "missing_key")
    assert all(r.value is None for r in a if r.kind == "tombstone")


def test_value_size_pads_to_about_the_target():
    sizes = [len(r.value) for r in generate_changelog(2000, 500, seed=1, value_size=200,
                                                       malformed_share=0, delete_share=0)]
    assert 195 <= sum(sizes) / len(sizes) <= 215


def test_v2_changes_a_visible_share_of_titles():
    recs = [r for r in generate_changelog(20_000, 20_000, seed=2) if r.kind == "upsert"]
    titles = [json.loads(r.value)["title"] for r in recs]
    changed = sum(V1.standardize_title(t) != V2.standardize_title(t) for t in titles)
    assert 0.15 < changed / len(titles) < 0.6


def log_of(*records: tuple[bytes | None, bytes | None]) -> list[LogRecord]:
    return [LogRecord(k, v, 0, i, 1_700_000_000_000 + i) for i, (k, v) in enumerate(records)]


def test_expected_table_semantics():
    p = lambda name, title: json.dumps({"name": name, "title": title}).encode()  # noqa: E731
    exp = expected_table(log_of(
        (b"m1", p("Ada", "SWE")),
        (b"m1", b'{"name": "Ada", "title": 42}'),   # malformed: m1 stays as it was
        (b"m2", p("Ken", "Senior SWE")),
        (b"m2", None),                             # deleted
        (b"m3", None),                             # tombstone of an unknown key: nothing
        (b"m4", p("Zoë", "Sr. Software Engineer")),
        (b"m4", None),
        (b"m4", p("Zoë", "Software Dev")),        # created again after its delete
        (None, p("Nobody", "SWE")),               # no key
    ), V2)
    rows = {r["member_id"]: r for r in exp.table.to_pylist()}
    assert list(rows) == ["m1", "m4"]
    assert (rows["m1"]["title"], rows["m1"]["source_offset"]) == ("Software Engineer", 0)
    assert (rows["m4"]["title_raw"], rows["m4"]["title"], rows["m4"]["source_offset"]) == (
        "Software Dev", "Software Engineer", 7)
    assert rows["m4"]["source_timestamp"].timestamp() == 1_700_000_000.007
    assert [(o, reason) for _, o, reason in exp.rejects] == [
        (1, "title: expected a string or null"), (8, "no key")]
    assert exp.records == 9
