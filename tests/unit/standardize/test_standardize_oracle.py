"""The tests' own oracle (tests/oracle/standardize.py): it covers everything the generator emits,
its reasons follow the records' malformed kinds, and the product's rules files agree with its
hand-written golden mapping."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from jobs.lib.rules.files import load_rules, rules_path
from jobs.lib.source.profiles import OUTPUT_SCHEMA as JOB_OUTPUT_SCHEMA
from orchestrator.dev import datagen
from orchestrator.dev.datagen import LogRecord, generate_changelog
from tests.oracle import standardize as oracle

SECTIONS = ("titles", "companies")


@pytest.mark.parametrize("section, pool", [("titles", datagen.TITLES), ("companies", datagen.COMPANIES)])
def test_the_golden_lists_every_spelling_of_the_generator_and_no_other(section, pool):
    """A spelling added to the generator without a golden entry fails here (and one removed leaves none stale)."""
    spellings = {raw for raw, _weight in pool}
    assert set(oracle.golden(section)) - spellings == set(), "golden entries the generator no longer emits"
    assert spellings - set(oracle.golden(section)) == set(), f"add these to {oracle.GOLDEN_PATH}"


def test_generated_profiles_use_only_golden_spellings(seed):
    """Whatever the generator builds its values from, every title and company it emits is in the golden."""
    seen = {"titles": set(), "companies": set()}
    for rec in generate_changelog(20_000, 3_000, seed=seed, malformed_share=0.05, delete_share=0.05):
        if rec.kind == "upsert":
            doc = json.loads(rec.value)
            seen["titles"].add(doc["title"])
            seen["companies"].add(doc["company"])
    for section in SECTIONS:
        assert seen[section] - set(oracle.golden(section)) == set()
        assert None in seen[section] and len(seen[section]) > 10


@pytest.mark.parametrize("version", oracle.RULES_VERSIONS)
@pytest.mark.parametrize("section", SECTIONS)
def test_the_rules_files_give_the_golden_value_of_every_spelling(section, version):
    rules = load_rules(rules_path("titles", version))
    wrong = {raw: (rules.standardize(section, raw), want[version]) for raw, want in oracle.golden(section).items()
             if rules.standardize(section, raw) != want[version]}
    assert wrong == {}, f"{section} under {version}: raw -> (the rules give, the golden says)"


def test_an_unknown_spelling_is_an_error_not_a_guess():
    with pytest.raises(LookupError) as e:
        oracle.standardize("titles", "Chief Vibes Officer", "v2")
    assert str(e.value) == ("golden_standardize.json has no titles entry for 'Chief Vibes Officer' under 'v2': add "
                            "one, worked out from jobs/rules/titles/v2.toml by hand")


def test_the_literal_output_schema_is_the_jobs():
    assert oracle.OUTPUT_SCHEMA.equals(JOB_OUTPUT_SCHEMA, check_metadata=True)


#: The reasons each malformed kind of the generator must get, spelled out (invalid_json: below).
REASONS_BY_KIND = {
    "wrong_type": {f"title: expected a string or null, got {t}" for t in ("number", "boolean", "array", "object")},
    "not_object": {"not a JSON object: array", "not a JSON object: string", "not a JSON object: null",
                   "not a JSON object: number", "invalid JSON: Expecting value: line 1 column 1 (char 0)"},
    "missing_name": {"name: missing"},
    "duplicate_field": {"title: given twice", "name: given twice", "company: given twice"},
}


def test_oracle_reasons_follow_the_generators_malformed_kinds(seed):
    reasons = defaultdict(set)
    for rec in generate_changelog(30_000, 500, seed=seed, malformed_share=0.3, delete_share=0.0):
        if rec.kind == "upsert":
            assert (oracle.key_reason(rec.key), oracle.value_reason(rec.value)) == (None, None), rec
        else:
            assert oracle.key_reason(rec.key) is None
            reasons[rec.kind].add(oracle.value_reason(rec.value))
    invalid = reasons.pop("invalid_json")
    assert dict(reasons) == REASONS_BY_KIND
    assert len(invalid) > 5 and all(r.startswith("invalid JSON: ") for r in invalid), invalid


@pytest.mark.parametrize("value, reason", [
    (b'{"name": "A", "title": "x", "title": "y"}', "title: given twice"),
    (b'{"name": "A", "na\\u006de": "B"}', "name: given twice"),               # the same field, escaped
    (b'{"title": "x", "title": "x", "name": "A", "name": "A"}', "name: given twice"),  # name before title
    (b'{"title": "x", "title": "y"}', "title: given twice"),                  # ambiguity before a missing name
    (b'{"name": "A", "bio": 1, "bio": {"name": 2, "name": 3}}', None),        # unknown fields: ignored
    (b'{"name": "caf\xe9"}', "invalid JSON: not UTF-8 at byte 13"),
    (b'{"name": "\\ud800"}', "name: invalid unicode (lone surrogate)"),
    (b'{"name": null}', "name: missing"),
    (b'{"name": 7}', "name: expected a string, got number"),
    (b'{"name": "A", "location": false}', "location: expected a string or null, got boolean"),
    (b'{"name": "A", "title": {"name": 1}}', "title: expected a string or null, got object"),
    (b'{"name": "A"} {"name": "B"}', "invalid JSON: Extra data: line 1 column 15 (char 14)"),
])
def test_oracle_reasons_of_edge_values(value, reason):
    assert oracle.value_reason(value) == reason


def log_of(*records: tuple[bytes | None, bytes | None]) -> list[LogRecord]:
    return [LogRecord(k, v, 0, i, 1_700_000_000_000 + i) for i, (k, v) in enumerate(records)]


def test_expected_table_semantics():
    p = lambda name, title: json.dumps({"name": name, "title": title}).encode()  # noqa: E731
    exp = oracle.expected_table(log_of(
        (b"m1", p("Ada", "SWE")),
        (b"m1", b'{"name": "Ada", "title": 42}'),   # malformed: m1 stays as it was
        (b"m2", p("Ken", "Senior SWE")),
        (b"m2", None),                             # deleted
        (b"m3", None),                             # tombstone of an unknown key: nothing
        (b"m4", p("Zoë", "Sr. Software Engineer")),
        (b"m4", None),
        (b"m4", p("Zoë", "Software Dev")),        # created again after its delete
        (None, p("Nobody", "SWE")),               # no key
        (b"m1", b'{"name": "Eve", "name": "Ada"}'),  # ambiguous: rejected, m1 unchanged
        (b"\xc3", None),                           # a tombstone whose key is not UTF-8
    ), "v2")
    rows = {r["member_id"]: r for r in exp.table.to_pylist()}
    assert list(rows) == ["m1", "m4"]
    assert (rows["m1"]["name"], rows["m1"]["title"], rows["m1"]["source_offset"]) == ("Ada", "Software Engineer", 0)
    assert (rows["m4"]["title_raw"], rows["m4"]["title"], rows["m4"]["source_offset"]) == (
        "Software Dev", "Software Engineer", 7)
    assert rows["m4"]["source_timestamp"].timestamp() == 1_700_000_000.007
    assert exp.rejects == [(0, 1, "title: expected a string or null, got number"), (0, 8, "no key"),
                           (0, 9, "name: given twice"), (0, 10, "key is not UTF-8 (byte 0)")]
    assert exp.records == 11 and exp.table.schema.equals(oracle.OUTPUT_SCHEMA)


def test_the_oracle_imports_nothing_of_the_jobs():
    import subprocess
    import sys

    probe = ("import sys, tests.oracle.standardize as o; o.expected_table([], 'v1'); o.as_log([]); "
             "print(sorted(m for m in sys.modules if m == 'jobs' or m.startswith('jobs.')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         cwd=oracle.GOLDEN_PATH.parents[2])
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stderr
