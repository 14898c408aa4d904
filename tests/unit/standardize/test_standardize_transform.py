"""The micro-batch transform: parsing, rejects, latest offset per key, rules on distinct values."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from jobs.lib.rules import load_rules, rules_path
from jobs.lib.profiles import OUTPUT_SCHEMA, parse_profiles, transform_batch
from orchestrator.dev.datagen import generate_changelog
from tests.oracle import standardize as oracle

V2 = load_rules(rules_path("titles", "v2"))


def profile(name="Ada Lovelace", title="Senior SWE", company="ACME Corp.", location="London, UK", **extra) -> bytes:
    doc = {"name": name, "title": title, "company": company, "location": location,
           "updated_at": "2024-01-01T00:00:00Z", **extra}
    return json.dumps(doc, ensure_ascii=False).encode()


def raw_batch(records: list[tuple[bytes | None, bytes | None]], partition: int = 0, first_offset: int = 0) -> pa.Table:
    n = len(records)
    return pa.table({
        "key": pa.array([k for k, _ in records], pa.binary()),
        "value": pa.array([v for _, v in records], pa.binary()),
        "topic": pa.array(["member_profiles"] * n, pa.string()),
        "partition": pa.array([partition] * n, pa.int32()),
        "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
        "timestamp": pa.array([1_700_000_000_000_000 + i for i in range(n)], pa.timestamp("us", tz="UTC")),
    })


def rows(result) -> dict[str, dict]:
    return {r["member_id"]: r for r in result.upserts.to_pylist()}


def test_latest_offset_per_key_wins_tombstones_delete_rules_apply():
    result = transform_batch(raw_batch([
        (b"m1", profile(title="Software Dev")),
        (b"m2", profile(name="Zoë Ødegaard", title="Ingénieur logiciel", company="Mueller GmbH")),
        (b"m1", profile(title="Sr. Software Engineer")),
        (b"m3", profile()),
        (b"m3", None),                                   # tombstone after an update: delete
        (b"m4", None),
        (b"m4", profile(name="美咲 佐藤", title=None, company=None)),  # update after a tombstone: row
    ]), V2, batch_id=7)
    out = rows(result)
    assert result.rows_in == 7 and result.tombstones == 2 and result.rejects.num_rows == 0
    assert set(out) == {"m1", "m2", "m3", "m4"}
    assert out["m1"]["title_raw"] == "Sr. Software Engineer" and out["m1"]["title"] == "Senior Software Engineer"
    assert out["m1"]["source_offset"] == 2 and out["m1"]["_deleted"] is False
    assert out["m2"]["name"] == "Zoë Ødegaard"
    assert (out["m2"]["title"], out["m2"]["company"]) == ("Software Engineer", "Müller GmbH")
    assert out["m3"]["_deleted"] is True and out["m3"]["source_offset"] == 4
    assert out["m4"]["_deleted"] is False and out["m4"]["name"] == "美咲 佐藤" and out["m4"]["title"] is None
    assert result.upserts.schema.names == OUTPUT_SCHEMA.names + ["_deleted"]
    assert result.upserts.drop_columns(["_deleted"]).schema.equals(OUTPUT_SCHEMA)


def test_malformed_records_go_to_rejects_and_leave_the_member_unchanged():
    good = profile(title="Senior SWE")
    result = transform_batch(raw_batch([
        (b"m1", good),
        (b"m1", b'{"name": "Broken", "title": "SWE"'),              # invalid JSON after a valid record
        (b"m2", json.dumps({"name": "X", "title": 42}).encode()),   # wrong type
        (b"m3", b'["Software Engineer"]'),                          # not an object
        (b"m4", json.dumps({"title": "SWE"}).encode()),             # no name
        (None, profile()),                                          # no key
        (b"\xff\xfe", profile()),                                   # key not UTF-8
        (b"m5", b""),                                               # empty value is not a tombstone
        (b"m6", b'{"name": "A"} {"name": "B"}'),                    # two objects
        (b"m7", b'{"name": "caf\xe9"}'),                           # value not UTF-8
        (b"m8", b'{"name": "A", "name": "B"}'),                    # a profile field twice
        (b"m9", b'null'),
        (b"m10", b'{"name": "A", "na\\u006de": "B"}'),            # the same field, spelled with an escape
        (b"m11", b'{"title": "x", "title": "x", "name": "A", "name": "A"}'),  # two fields twice
        (b"m12", b'{"name": "A", "title": {"name": 1}}'),            # an object, "name" twice in the text
    ], partition=3, first_offset=100), V2, batch_id=5)
    out = rows(result)
    assert set(out) == {"m1"} and out["m1"]["source_offset"] == 100 and out["m1"]["title_raw"] == "Senior SWE"
    rejects = {r["offset"]: r for r in result.rejects.to_pylist()}
    assert sorted(rejects) == list(range(101, 115))
    assert {r["partition"] for r in rejects.values()} == {3}
    assert {r["batch_id"] for r in rejects.values()} == {5}
    assert {r["topic"] for r in rejects.values()} == {"member_profiles"}
    reasons = {o: r["error"] for o, r in rejects.items()}
    assert reasons[101] == "invalid JSON: Expecting ',' delimiter: line 1 column 34 (char 33)"
    assert reasons[102] == "title: expected a string or null, got number"
    assert reasons[103] == "not a JSON object: array"
    assert reasons[104] == "name: missing"
    assert reasons[105] == "no key"
    assert reasons[106] == "key is not UTF-8 (byte 0)"
    assert reasons[107] == "invalid JSON: Expecting value: line 1 column 1 (char 0)"
    assert reasons[108] == "invalid JSON: Extra data: line 1 column 15 (char 14)"
    assert reasons[109] == "invalid JSON: not UTF-8 at byte 13"
    assert reasons[110] == "name: given twice"
    assert reasons[111] == "not a JSON object: null"
    assert reasons[112] == "name: given twice"
    assert reasons[113] == "name: given twice"   # the first of the profile fields, whatever the set order
    assert reasons[114] == "title: expected a string or null, got object"
    values = {r["offset"]: r["value"] for r in rejects.values()}
    assert {o: oracle.value_reason(v) for o, v in values.items() if o not in (105, 106)} == {
        o: r for o, r in reasons.items() if o not in (105, 106)}
    assert rejects[106]["key"] == b"\xff\xfe" and rejects[109]["value"] == b'{"name": "caf\xe9"}'
    assert rejects[105]["key"] is None


def test_values_pyarrow_cannot_take_line_by_line_are_still_parsed():
    pretty = json.dumps({"name": "Grace Hopper", "title": "Rear Admiral"}, indent=2).encode()
    result = transform_batch(raw_batch([
        (b"m1", pretty),                                     # line breaks inside
        (b"m2", b'  {"name": "Ken", "title": "SWE"}  '),     # surrounding whitespace
        (b"m3", profile(bio={"nested": [1, {"name": 2}]}, extra=float("nan"))),  # ignored fields of any kind
    ]), V2, batch_id=0)
    out = rows(result)
    assert result.rejects.num_rows == 0
    assert out["m1"]["title"] == "Rear Admiral" and out["m2"]["title"] == "Software Engineer"
    assert out["m3"]["name"] == "Ada Lovelace"


def test_batch_of_tombstones_only():
    result = transform_batch(raw_batch([(b"m1", None), (b"m2", None), (b"m1", None)]), V2, batch_id=0)
    assert sorted((r["member_id"], r["_deleted"], r["source_offset"]) for r in result.upserts.to_pylist()) == [
        ("m1", True, 2), ("m2", True, 1)]


def test_empty_batch():
    result = transform_batch(raw_batch([]), V2, batch_id=0)
    assert result.rows_in == 0 and result.upserts.num_rows == 0 and result.rejects.num_rows == 0


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("bad_every", [1, 3, 50, 997, None])
def test_fast_and_slow_parsing_agree_record_by_record(bad_every, threads, monkeypatch):
    """Whatever the density of bad records, parse_profiles decides each value like the tests' oracle."""
    import jobs.lib.profiles as std

    monkeypatch.setattr(std, "PARSE_THREADS", threads)
    monkeypatch.setattr(std, "PARSE_MIN_PER_THREAD", 1000)
    rng = random.Random(bad_every or 0)
    bad_values = [b'{"name": 1}', b'{"name": "a", "title": [1]}', b'{"name": "a"', b'{"title": "x"}',
                  b'{"name": "a", "name": "b"}', b'{"name": "a", "title": {"x": 1}}', b"{}",
                  b'{"name": "a"}{"name": "b"}', b'{"name": true}', b'{"name": "a", "na\\u006de": "b"}',
                  b'{"title": "x", "name": "a", "title": "y", "name": "b"}']
    values = []
    for i in range(5000):
        if bad_every and i % bad_every == 0:
            values.append(rng.choice(bad_values))
        else:
            values.append(profile(name=f"Member {i}", title=rng.choice(["SWE", None, "Nurse ✨"])))
    positions, table, errors = parse_profiles(pa.array(values, pa.binary()))
    decided = [oracle.parse_profile(v) for v in values]
    expected_good = {i: doc for i, (doc, err) in enumerate(decided) if err is None}
    expected_bad = {i: err for i, (doc, err) in enumerate(decided) if err is not None}
    got = dict(zip(positions.tolist(), table.to_pylist()))
    assert got == expected_good
    assert dict(errors) == expected_bad
    assert len(errors) == len(expected_bad)


def test_transform_equals_the_independent_expected_table(seed):
    """Replaying the generated log batch by batch through transform_batch gives the oracle's table and rejects."""
    log = oracle.as_log(generate_changelog(6000, 1500, seed=seed, malformed_share=0.03, delete_share=0.05))
    expected = oracle.expected_table(log, "v2")

    state: dict[str, dict] = {}
    rejects = []
    for b, start in enumerate(range(0, len(log), 1000)):
        chunk = log[start:start + 1000]
        batch = pa.table({
            "key": pa.array([r.key for r in chunk], pa.binary()),
            "value": pa.array([r.value for r in chunk], pa.binary()),
            "topic": pa.array(["t"] * len(chunk)),
            "partition": pa.array([r.partition for r in chunk], pa.int32()),
            "offset": pa.array([r.offset for r in chunk], pa.int64()),
            "timestamp": pa.array([r.timestamp_ms * 1000 for r in chunk], pa.timestamp("us", tz="UTC")),
        })
        result = transform_batch(batch, V2, b)
        for row in result.upserts.to_pylist():
            if row.pop("_deleted"):
                state.pop(row["member_id"], None)
            else:
                state[row["member_id"]] = row
        rejects += [(r["partition"], r["offset"], r["error"]) for r in result.rejects.to_pylist()]
    got = pa.Table.from_pylist([state[k] for k in sorted(state)], schema=OUTPUT_SCHEMA)
    assert got.schema.equals(oracle.OUTPUT_SCHEMA)
    assert got.equals(expected.table)
    assert sorted(rejects) == sorted(expected.rejects)
    assert len(expected.rejects) > 100 and pc.sum(pc.is_null(expected.table["title"])).as_py() > 0
    assert any(reason.endswith(": given twice") for _, _, reason in expected.rejects)


#: Bytes spliced into generated values: JSON structure, escapes (the same field spelled with one),
#: lone surrogates, invalid UTF-8, line breaks, numbers pyarrow and Python read differently.
SPLICES = [b'"name"', b'"title"', b'null', b'42', b'true', b'[1]', b'{"a":1}', b'\\u0041', b'\\ud800', b',', b':',
           b'"', b'\\', b'\n', b' ', b'\xff', b'\xc3\xa9', b'"na\\u006de": "x",', b'"title": 1,', b'NaN', b'1e999',
           b'-0', b'"\\"', b'}', b'{']


def test_parse_profiles_decides_mutated_values_like_the_oracle(rng):
    """Generated values with bytes spliced in, cut out or cut short: each decided like tests/oracle."""
    values = []
    for rec in generate_changelog(3000, 1000, seed=rng.randrange(1 << 30), malformed_share=0.2):
        v = rec.value
        if v is None:
            continue
        for _ in range(rng.randrange(3)):
            i, op = rng.randrange(len(v) + 1), rng.random()
            v = (v[:i] + rng.choice(SPLICES) + v[i:] if op < 0.5 else v[:i] + v[i + rng.randrange(1, 5):] if op < 0.8
                 else v[:i])
        values.append(v)
    positions, table, errors = parse_profiles(pa.array(values, pa.binary()))
    got = {**{p: row for p, row in zip(positions.tolist(), table.to_pylist())}, **dict(errors)}
    want = {i: doc if err is None else err for i, (doc, err) in enumerate(map(oracle.parse_profile, values))}
    assert got == want
    assert sum(isinstance(w, str) for w in want.values()) > 500   # plenty of rejects among them
