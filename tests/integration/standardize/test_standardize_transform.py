"""The standardize job in Spark (its contract function `jobs.standardize.transform`, then kappa's
per-batch step `jobs.lib.contract.runner.group_micro_batch` or `split_batch`, `jobs.lib.source.profiles.parse_records`) on hand-made micro-batches: latest record per key, tombstones, every kind of reject with the exact
reason, and values the JVM path cannot vouch for decided like the tests' oracle (tests/oracle)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from jobs.lib.contract.api import JobInput
from jobs.lib.contract.runner import (batch_counts, batch_latest, batch_rejects, group_batch, group_micro_batch,
                                     output_columns, split_batch)
from jobs.lib.rules.files import load_rules, rules_path
from jobs.lib.source.profiles import OUTPUT_SCHEMA, parse_records
from jobs.standardize import transform
from orchestrator.dev.datagen import generate_changelog
from tests.oracle import standardize as oracle

pytestmark = pytest.mark.integration

V2 = load_rules(rules_path("titles", "v2"))
SOURCE_DDL = "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
T0 = datetime(2023, 11, 14, tzinfo=timezone.utc)


def profile(name="Ada Lovelace", title="Senior SWE", company="ACME Corp.", location="London, UK", **extra) -> bytes:
    doc = {"name": name, "title": title, "company": company, "location": location,
           "updated_at": "2024-01-01T00:00:00Z", **extra}
    return json.dumps(doc, ensure_ascii=False).encode()


def batch(spark, records, partition: int = 0, first_offset: int = 0):
    return spark.createDataFrame(
        [(k, v, "member_profiles", partition, first_offset + i, T0 + timedelta(microseconds=i))
         for i, (k, v) in enumerate(records)], SOURCE_DDL)


def job_of(spark, transform=transform):
    """The job's function over a micro-batch, as kappa's runner calls it."""
    def call(source):
        return transform(JobInput(spark=spark, source=source, read=lambda topics=None: source, options={}, rules=V2,
                                  key=("member_id",), topics=("member_profiles",), pipeline="standardize", version=1))
    return call


def run(spark, records, **kw):
    """(latest rows by key, rejects by offset, records) of one micro-batch through kappa's runner's step
    (`group_micro_batch`: the exact parser over only the records the JVM leaves it)."""
    source = batch(spark, records, **kw)
    call = job_of(spark)
    grouped = group_micro_batch(source, call, output_columns(call(source).rows), "member_id", "partition")
    try:
        out, rejects = batch_latest(grouped.latest, "member_id", grouped.then), batch_rejects(grouped.rejects)
        return ({r["member_id"]: r.asDict() for r in out.collect()},
                {r["offset"]: r.asDict() for r in rejects.collect()}, grouped.counts[0])
    finally:
        for df in grouped.held:
            df.unpersist()


def test_latest_offset_per_key_wins_tombstones_delete_rules_apply(spark):
    out, rejects, rows_in = run(spark, [
        (b"m1", profile(title="Software Dev")),
        (b"m2", profile(name="Zoë Ødegaard", title="Ingénieur logiciel", company="Mueller GmbH")),
        (b"m1", profile(title="Sr. Software Engineer")),
        (b"m3", profile()),
        (b"m3", None),                                   # tombstone after an update: delete
        (b"m4", None),
        (b"m4", profile(name="美咲 佐藤", title=None, company=None)),  # update after a tombstone: row
    ])
    assert rows_in == 7 and not rejects
    assert set(out) == {"m1", "m2", "m3", "m4"}
    assert out["m1"]["title_raw"] == "Sr. Software Engineer" and out["m1"]["title"] == "Senior Software Engineer"
    assert out["m1"]["source_offset"] == 2 and out["m1"]["_deleted"] is False
    assert out["m2"]["name"] == "Zoë Ødegaard"
    assert (out["m2"]["title"], out["m2"]["company"]) == ("Software Engineer", "Müller GmbH")
    assert out["m3"]["_deleted"] is True and out["m3"]["source_offset"] == 4
    assert out["m4"]["_deleted"] is False and out["m4"]["name"] == "美咲 佐藤" and out["m4"]["title"] is None
    assert list(out["m1"])[:len(OUTPUT_SCHEMA.names) + 1] == OUTPUT_SCHEMA.names + ["_deleted"]


def test_malformed_records_go_to_rejects_with_the_exact_reason_and_leave_the_member_unchanged(spark):
    out, rejects, _ = run(spark, [
        (b"m1", profile(title="Senior SWE")),
        (b"m1", b'{"name": "Broken", "title": "SWE"'),              # invalid JSON after a valid record
        (b"m2", json.dumps({"name": "X", "title": 42}).encode()),   # wrong type
        (b"m3", b'["Software Engineer"]'),                          # not an object
        (b"m4", json.dumps({"title": "SWE"}).encode()),             # no name
        (None, profile()),                                          # no key
        (b"\xff\xfe", profile()),                                   # key not UTF-8
        (b"m5", b""),                                               # empty value is not a tombstone
        (b"m6", b'{"name": "A"} {"name": "B"}'),                    # two objects (the JVM reads the first only)
        (b"m7", b'{"name": "caf\xe9"}'),                           # value not UTF-8
        (b"m8", b'{"name": "A", "name": "B"}'),                    # a profile field twice
        (b"m9", b'null'),
        (b"m10", b'{"name": "A", "na\\u006de": "B"}'),            # the same field, spelled with an escape
        (b"m11", b'{"title": "x", "title": "x", "name": "A", "name": "A"}'),  # two fields twice
        (b"m12", b'{"name": "A", "title": {"name": 1}}'),            # an object, "name" twice in the text
        (b"m13", b'{"name": "A"}]'),                                 # a bracket after the object
        (b"m14", b'{"name": "\\ud800"}'),                            # a lone surrogate
    ], partition=3, first_offset=100)
    assert set(out) == {"m1"} and out["m1"]["source_offset"] == 100 and out["m1"]["title_raw"] == "Senior SWE"
    assert sorted(rejects) == list(range(101, 117))
    assert {r["partition"] for r in rejects.values()} == {3} and {r["topic"] for r in rejects.values()} == {"member_profiles"}
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
    assert reasons[115] == "invalid JSON: Extra data: line 1 column 14 (char 13)"
    assert reasons[116] == "name: invalid unicode (lone surrogate)"
    values = {o: r["value"] for o, r in rejects.items()}
    assert {o: oracle.value_reason(bytes(v)) for o, v in values.items() if o not in (105, 106)} == {
        o: r for o, r in reasons.items() if o not in (105, 106)}
    assert bytes(rejects[106]["key"]) == b"\xff\xfe" and bytes(rejects[109]["value"]) == b'{"name": "caf\xe9"}'
    assert rejects[105]["key"] is None


def test_values_the_jvm_path_does_not_vouch_for_are_still_parsed(spark):
    pretty = json.dumps({"name": "Grace Hopper", "title": "Rear Admiral"}, indent=2).encode()
    out, rejects, _ = run(spark, [
        (b"m1", pretty),                                     # line breaks inside
        (b"m2", b'  {"name": "Ken", "title": "SWE"}  '),     # surrounding whitespace
        (b"m3", profile(bio={"nested": [1, {"name": 2}]}, extra=float("nan"))),  # ignored fields of any kind
        (b"m4", b'{"name": "Ada", "title": "a}b"}'),         # a brace inside a string
        (b"m5", b'{"name": "Al\\u0041n", "x": {"y": 1, "y": 2}}'),  # an escape; a key twice in an ignored field
    ])
    assert not rejects
    assert out["m1"]["title"] == "Rear Admiral" and out["m2"]["title"] == "Software Engineer"
    assert out["m3"]["name"] == "Ada Lovelace" and out["m4"]["title_raw"] == "a}b" and out["m5"]["name"] == "AlAn"


#: Values where a JSON reader other than Python's could decide otherwise: byte-order marks, UTF-16,
#: overlong or surrogate UTF-8, nesting past the JVM reader's depth, long numbers, what Jackson's options
#: would allow (comments, single quotes, leading zeros, trailing commas, NaN), escapes, surrogate pairs.
READER_EDGES = [
    b'\xef\xbb\xbf{"name": "A"}', '{"name": "A"}'.encode("utf-16-le"), '{"name": "A"}'.encode("utf-16"),
    b'{"name": "\xc0\xaf"}', b'{"name": "\xed\xa0\x80"}', b'{"name": "\xf4\x90\x80\x80"}', b'{"name": "\xe2\x82"}',
    b'{"name": "A", "x": ' + b"[" * 63 + b"]" * 63 + b"}", b'{"name": "A", "x": ' + b"[" * 64 + b"]" * 64 + b"}",
    b'{"name": "A", "x": ' + b"[" * 100 + b"]" * 100 + b"}", b'{"name": "A", "x": ' + b"1" * 1500 + b"}",
    b'{"name": "A", "x": ' + b"1" * 5000 + b"}", b'{"name": "A", "x": 1' + b"0" * 999 + b"}",
    b'{"name": "A", "x": "\\ud800"}', b'{"name": "A", "x": 1, "x": "y"}', b'{"name": "A"}\x00',
    b'{"name": "A", "n": 01}', b'{"name": "A", "n": 1.}', b'{"name": "A", "n": .5}', b'{"name": "A", "n": -}',
    b'{"name": "A", "n": -0.0E-3, "m": 1e5, "k": Infinity, "j": -Infinity}', b'{"name": "A",}',
    b"{'name': 'A'}", b'{"name": "A" /* c */}', b'{"name": "A\\/B \\u00e9 \\u0000"}', b'{"name": "\\ud83d\\ude00"}',
    '{"name": "\U0001f600"}'.encode(), b'{}', b'{"name": null}', b'{"name": "A", "title": null}',
    b'\x0c{"name": "A"}', '\u00a0{"name": "A"}'.encode(), b'{"name": "A"}\n\r\t ', b'{"name": "A", "x": "a\tb"}',
    b'{"name": "A", "x": "\\q"}', b'{"name": TRUE}', b'{"name": "A", "title": True}', b'{"name": "A", "title": false}',
    b'{"name": "A", "title": "x", "title": null}', b'{"name": ["A"]}', b'[{"name": "A"}]', b'"A"', b'{"name": "A"',
    b'{"name"\t:\r"A"\n}', b'{"name": "\\u0041\\u0042"}', b'{"\\u006eame": "A"}', b'{"name": "A", "name2": "B"}',
]


def test_values_another_json_reader_could_misread_are_decided_like_the_oracle(spark):
    """Each edge of kappa's JVM reading (`jobs/lib/source/jvm/JsonFields.java`) decided like tests/oracle:
    where Jackson's reading might differ from Python's, the exact parser decides."""
    rows = parse_records(batch(spark, [(b"k", v) for v in READER_EDGES])).collect()
    fields = oracle.PROFILE_FIELDS
    got = {r["offset"]: r["error"] if r["error"] is not None else {f: r[f] for f in fields} for r in rows}
    want = {i: doc if err is None else err for i, (doc, err) in enumerate(map(oracle.parse_profile, READER_EDGES))}
    assert got == want
    assert 10 < sum(isinstance(w, str) for w in want.values()) < len(READER_EDGES) - 10   # both kinds


def test_batch_of_tombstones_only(spark):
    out, rejects, _ = run(spark, [(b"m1", None), (b"m2", None), (b"m1", None)])
    assert sorted((k, r["_deleted"], r["source_offset"]) for k, r in out.items()) == [("m1", True, 2), ("m2", True, 1)]
    assert not rejects


#: Bytes spliced into generated values: JSON structure, escapes (the same field spelled with one),
#: lone surrogates, invalid UTF-8, line breaks, numbers the JVM and Python read differently.
SPLICES = [b'"name"', b'"title"', b'null', b'42', b'true', b'[1]', b'{"a":1}', b'\\u0041', b'\\ud800', b',', b':',
           b'"', b'\\', b'\n', b' ', b'\xff', b'\xc3\xa9', b'"na\\u006de": "x",', b'"title": 1,', b'NaN', b'1e999',
           b'-0', b'"\\"', b'}', b'{', b']', b'\x01', b'\t', b'\x0c', b'\xe2\x80\xa8', b'\\u007d', b'},{',
           b'\xef\xbb\xbf', b'\xc0\xaf', b'\xed\xa0\x80', b'\x00', b'01', b'Infinity', b'/*', b"'", b'[[[[']


def test_parse_records_decides_mutated_values_like_the_oracle(spark, rng):
    """Generated values with bytes spliced in, cut out or cut short: each decided like tests/oracle,
    whichever path (JVM or exact parser) took it."""
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
    rows = parse_records(batch(spark, [(b"k", v) for v in values])).collect()
    fields = oracle.PROFILE_FIELDS
    got = {r["offset"]: r["error"] if r["error"] is not None else {f: r[f] for f in fields} for r in rows}
    want = {i: doc if err is None else err for i, (doc, err) in enumerate(map(oracle.parse_profile, values))}
    assert got == want
    assert sum(isinstance(w, str) for w in want.values()) > 500   # plenty of rejects among them


def test_each_value_is_parsed_once_in_the_executed_plan(spark):
    """The parse is materialised once per record: no filter or projection copies it (the plan had it
    eleven times, and the field types eighteen), and the per-batch step adds no second parse."""
    from jobs.lib.source.json_values import PARSE_CALL

    source = batch(spark, [(b"m1", profile()), (b"m2", b"{oops")])
    parsed = parse_records(source)
    assert parsed._jdf.queryExecution().executedPlan().toString().count(PARSE_CALL) == 1
    job = JobInput(spark=spark, source=source, read=lambda topics=None: source, options={}, rules=V2,
                   key=("member_id",), topics=("member_profiles",), pipeline="standardize", version=1)
    result = transform(job)
    rejects, out = split_batch(result.rows, output_columns(result.rows), "member_id", "partition", result.then)
    for df in (rejects, out):
        assert df._jdf.queryExecution().executedPlan().toString().count(PARSE_CALL) == 1
    assert sorted(r["member_id"] for r in out.collect()) == ["m1"] and rejects.count() == 1


def test_the_first_parse_under_a_context_analyses_each_of_its_selects_once(spark, monkeypatch):
    """The first call for a job's fields makes the parse's selects and analyses three of them to learn the
    fields' types; it answers from that frame rather than selecting the three again (each select is an
    analysis of the whole plan, slow on a fresh JVM: the probe a query's start runs). It made 7 selects
    before, 4 now; a later call makes 4, and both answer the same."""
    from pyspark.sql.classic.dataframe import DataFrame

    from jobs.lib.source.json_values import PARSE_CALL, parse_json_values
    from jobs.lib.source.profiles import _EXACT_DDL, INPUT_COLUMNS, PROFILE_FIELDS, _exact, _key_ok, judge_profile

    source = batch(spark, [(b"m1", profile()), (b"m2", b"{oops"), (b"m3", None), (b"m4", b'{"name": 7}')])
    records = source.select(*INPUT_COLUMNS)
    name = object()   # a name no other call used: the first call below builds the steps
    selects = []
    select = DataFrame.select
    monkeypatch.setattr(DataFrame, "select", lambda self, *cols: selects.append(1) or select(self, *cols))

    def parse():
        selects.clear()
        out = parse_json_values(records, keep=INPUT_COLUMNS, fields=PROFILE_FIELDS, key_ok=_key_ok,
                                judge=judge_profile, exact=_exact, exact_ddl=_EXACT_DDL, name=name)
        return len(selects), out

    first_selects, first = parse()
    later_selects, later = parse()
    monkeypatch.undo()
    assert (first_selects, later_selects) == (4, 4)
    assert first.schema == later.schema
    assert sorted(map(tuple, first.collect())) == sorted(map(tuple, later.collect()))
    assert first._jdf.queryExecution().executedPlan().toString().count(PARSE_CALL) == 1
    errors = {r["offset"]: r["error"] for r in first.collect()}
    assert errors[0] is None and errors[2] is None and errors[1].startswith("invalid JSON") and errors[3]


def test_the_plan_of_a_later_micro_batch_reuses_the_job_s_expressions(spark, monkeypatch):
    """The job's function runs on every micro-batch; its expressions (the rules' lookup map, a JVM round
    trip per spelling, and the parse's checks) are made for the first and reused after it
    (`jobs.lib.runtime.columns`). A later batch's plan took ~4,500 round trips to the JVM before, 0.6-1 s
    of a live batch's driver time here; the answers stay the same."""
    import py4j.clientserver

    def plan(records):
        source = batch(spark, records)
        job = JobInput(spark=spark, source=source, read=lambda topics=None: source, options={}, rules=V2,
                       key=("member_id",), topics=("member_profiles",), pipeline="standardize", version=1)
        result = transform(job)
        return split_batch(result.rows, output_columns(result.rows), "member_id", "partition", result.then)

    plan([(b"m0", profile())])                                    # the first batch makes them
    calls = []
    send = py4j.clientserver.ClientServerConnection.send_command
    monkeypatch.setattr(py4j.clientserver.ClientServerConnection, "send_command",
                        lambda self, command, *a, **k: calls.append(1) or send(self, command, *a, **k))
    rejects, out = plan([(b"m1", profile(title="sr. swe")), (b"m2", b"{oops")])
    monkeypatch.undo()
    assert len(calls) < 1000, f"{len(calls)} round trips to the JVM to plan a later micro-batch"
    assert [(r["member_id"], r["title"]) for r in out.collect()] == [("m1", "Senior Software Engineer")]
    assert [r["error"] for r in rejects.collect()] == ["invalid JSON: Expecting property name enclosed in double "
                                                      "quotes: line 1 column 2 (char 1)"]


def test_rules_over_a_column_of_one_dataframe_are_made_again_for_another(spark):
    """`Rules.column` keeps its expression for a column by name; a column bound to one DataFrame
    (``df["raw"]``) is not that of the next, which gets its own expression, not the first one's."""
    from pyspark.sql import functions as F

    for raw in ("sr swe", "intern", "sr swe"):
        df = spark.createDataFrame([(raw,)], "raw string")
        for column in (df["raw"], F.col("raw")):
            got = df.select(V2.column("titles", column).alias("t")).first()["t"]
            assert got == V2.standardize("titles", raw), raw


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_rules_as_spark_expressions_equal_the_python_rules_on_every_value(spark, rng, version):
    """`Rules.column` (the job's, in Spark) and `Rules.standardize` (the rules preview's, in Python) give
    the same value for every golden spelling and for generated ones with odd whitespace and Unicode."""
    from pyspark.sql import functions as F

    rules = load_rules(rules_path("titles", version))
    raws = [r for section in ("titles", "companies") for r in oracle.golden(section)]
    pieces = ["sr", "Senior", "SWE", "software", "engineer", "intern", "ship", "Ｓｅｎｉｏｒ", "ß", "İ", "é", "e\u0301",
              "\u00a0", "\u2003", "\x1c", "\x1f", "\t", "\n", " ", ".", "-", "+", "#", "_", "Ⅷ", "ﬁ", "💡"]
    raws += ["".join(rng.choice(pieces) for _ in range(rng.randrange(1, 7))) for _ in range(400)]
    raws += [None, "", "   ", "\x1c\x1d"]
    # found by the generator: "İ" lowercases to "i" + U+0307, a combining mark that Python's \w leaves
    # out and Java's (?U) \w takes in, so \bintern\b matched in Python only (`java_regex` spells \b out)
    raws += ["İintern\x1c_", "softwareİinternship", "+éİintern\u2003", "\x1cＳｅｎｉｏｒİintern", "#💡éİintern"]
    df = spark.createDataFrame([(i, r) for i, r in enumerate(raws)], "i int, raw string")
    got = {r["i"]: (r["t"], r["c"]) for r in df.select(
        "i", rules.column("titles", F.col("raw")).alias("t"), rules.column("companies", F.col("raw")).alias("c")).collect()}
    want = {i: (rules.standardize("titles", r), rules.standardize("companies", r)) for i, r in enumerate(raws)}
    assert {i: (raws[i], g) for i, g in got.items() if g != want[i]} == {}


def test_the_batch_s_aggregation_builds_no_list_and_keeps_every_reject(spark):
    """The rejects ride the one aggregation as groups of their own (`group_batch`): no collect_list, so
    Spark plans no object hash aggregate (it sorted past 128 keys and kept a list per key), and a reject
    the job's rows hold twice is written twice."""
    from jobs.lib.contract.runner import batch_counts, group_batch

    source = batch(spark, [(b"m1", profile(title="a")), (b"m1", b"{bad"), (b"m2", b"{bad"), (b"m1", profile(title="b")),
                           (b"m3", None), (None, profile())])
    rows = parse_records(source)
    twice = rows.union(rows.where("error IS NOT NULL AND member_id = 'm2'"))   # a job that emits a reject twice
    g = group_batch(twice, ["member_id", "name", "title"], "member_id", "partition")
    plan = g._jdf.queryExecution().executedPlan().toString()
    assert "ObjectHashAggregate" not in plan and "collect_list" not in plan
    rejects, out = split_batch(twice, ["member_id", "name", "title"], "member_id", "partition", None)
    assert sorted((r["offset"], r["error"]) for r in rejects.collect()) == [
        (1, "invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (2, "invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (2, "invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (5, "no key")]
    assert sorted((r["member_id"], r["title"], r["_deleted"]) for r in out.collect()) == [
        ("m1", "b", False), ("m3", None, True)]
    assert batch_counts(g, "member_id") == (7, 4, 2, [], 0)   # nothing left pending: no parse was deferred


def _mutated(rng, n: int, keys: int, partitions: int) -> list[tuple]:
    """(key, value, partition) of generated records, some with bytes spliced in or cut (`SPLICES`)."""
    out = []
    for rec in generate_changelog(n, keys, seed=rng.randrange(1 << 30), malformed_share=0.1):
        v = rec.value
        if v is not None and rng.random() < 0.3:
            i, op = rng.randrange(len(v) + 1), rng.random()
            v = (v[:i] + rng.choice(SPLICES) + v[i:] if op < 0.5 else v[:i] + v[i + rng.randrange(1, 5):] if op < 0.8
                 else v[:i])
        out.append((rec.key if rng.random() > 0.01 else None, v, rng.randrange(partitions)))
    return out


def _kafka_batch(spark, records: list[tuple]):
    """The records as Spark's Kafka source gives a micro-batch, ``timestampType`` included."""
    nxt, rows = {}, []
    for i, (k, v, p) in enumerate(records):
        nxt[p] = nxt.get(p, -1) + 1
        rows.append((k, v, "member_profiles", p, nxt[p], T0 + timedelta(milliseconds=i // 3), 0))
    return spark.createDataFrame(rows, SOURCE_DDL + ", timestampType int")


def _results(counts, latest_groups, reject_groups, then) -> tuple:
    rows_in, n_rejects, rows_out, conflicts, pending = counts
    latest = sorted((tuple(r) for r in batch_latest(latest_groups, "member_id", then).collect()), key=repr)
    rejects = sorted(((r["partition"], r["offset"], r["error"], r["key"], r["value"])
                      for r in batch_rejects(reject_groups).collect()), key=repr)
    return (rows_in, n_rejects, rows_out, pending, len(conflicts), latest, rejects,
            set(conflicts) if len(conflicts) < 5 else None)


def _exact_results(rows, then, key_order: str) -> tuple:
    g = group_batch(rows, output_columns(rows), "member_id", key_order)
    return _results(batch_counts(g, "member_id"), g, g, then)


def _runner_results(grouped) -> tuple:
    try:
        return _results(grouped.counts, grouped.latest, grouped.rejects, grouped.then)
    finally:
        for df in grouped.held:
            df.unpersist()


@pytest.mark.parametrize("key_order,broadcast", [("partition", True), ("timestamp", True), ("partition", False)])
def test_the_runner_s_step_gives_the_exact_parser_only_what_the_jvm_left_it_and_answers_as_the_exact_plan(
        spark, rng, monkeypatch, key_order, broadcast):
    """`group_micro_batch` leaves the Arrow UDF out of the batch's pass (no record goes through Spark's
    Python runner there), lets the records the JVM cannot vouch for ride the aggregation as `PENDING`, and
    parses only those again: its latest rows, rejects (reasons, raw bytes), counts and keys seen in two
    partitions equal those of the plan with the exact parser over every record (`split_batch`'s), on
    mutated records over three partitions, where a key's latest row may come from either pass; the pending
    keys broadcast to split the groups, or joined without the hint (past `BROADCAST_PENDING`)."""
    from jobs.lib.contract import runner
    from jobs.lib.source.json_values import deferring

    if not broadcast:
        monkeypatch.setattr(runner, "BROADCAST_PENDING", 0)

    source = _kafka_batch(spark, _mutated(rng, 1500, 120, 3))
    call = job_of(spark)
    with deferring():
        deferred_rows = call(source).rows
    assert "ArrowEvalPython" not in deferred_rows._jdf.queryExecution().executedPlan().toString()
    exact = call(source)
    assert "ArrowEvalPython" in exact.rows._jdf.queryExecution().executedPlan().toString()   # what it leaves out
    want = _exact_results(exact.rows, exact.then, key_order)
    grouped = group_micro_batch(source, call, output_columns(exact.rows), "member_id", key_order)
    got = _runner_results(grouped)
    assert grouped.deferred and grouped.deferred > 50       # records went the second way
    assert got[3] == want[3] == 0                           # none left pending
    assert got == want
    assert want[1] > 100 and want[2] > 50                   # rejects and rows both
    assert (want[4] > 0) == (key_order == "partition")      # keys in two partitions, refused under that order


def test_a_job_whose_plan_may_drop_or_change_a_pending_record_gets_the_exact_parser_in_its_plan(spark, rng):
    """The runner leaves the exact parser out only when every record the parse left reaches the
    aggregation as it left it (`deferral_holds`): a job that filters its rows, or words ``error`` itself,
    is planned again with the exact parser over every record, and its answers are those of that plan."""
    from pyspark.sql import functions as F

    def filtering(job):
        u = transform(job)
        return type(u)(u.rows.where(F.col("name").isNull() | (F.col("name") != "nobody")), then=u.then)

    def rewording(job):
        u = transform(job)
        return type(u)(u.rows.withColumn("error", F.concat(F.lit("bad: "), F.col("error"))), then=u.then)

    source = _kafka_batch(spark, _mutated(rng, 400, 60, 1))
    for fn in (filtering, rewording, transform):
        call = job_of(spark, fn)
        exact = call(source)
        want = _exact_results(exact.rows, exact.then, "partition")
        grouped = group_micro_batch(source, call, output_columns(exact.rows), "member_id", "partition")
        got = _runner_results(grouped)
        assert (grouped.deferred is None) == (fn is not transform), fn.__name__
        assert got == want, fn.__name__
        assert want[1] > 20, fn.__name__
