"""kappa's JVM reading of a record's value (`jobs/lib/source/jvm/JsonFields.java`, ``kappa_json_fields``):
each named top-level field's JSON type and text where it reads the value as Python's json would, and
nothing (null: the exact parser decides) wherever its reading might differ."""

from __future__ import annotations

import pytest

from jobs.lib.runtime.jvm import JSON_FIELDS

pytestmark = pytest.mark.integration

NAMES = "name,title,flag"


def read(spark, values: list[bytes | None]) -> list[tuple | None]:
    df = spark.createDataFrame([(i, v) for i, v in enumerate(values)], "i int, value binary")
    rows = df.selectExpr("i", f"{JSON_FIELDS}(value, '{NAMES}') AS d").orderBy("i").collect()
    return [None if r["d"] is None else (tuple(r["d"]["t"]), tuple(r["d"]["v"])) for r in rows]


def test_the_named_fields_types_and_texts(spark):
    got = read(spark, [
        b'{"name": "Ada", "title": "SWE", "flag": true}',
        b'{"title": null, "flag": false, "other": [1, {"name": 2}], "name": "Zo\xc3\xab \\u00e9\\ud83d\\ude00"}',
        b'{"name": 1, "title": {"a": "b"}, "flag": [true]}',
        b' \n{"x": 1, "x": 2}\t\r\n ',
        b'{"name": "A", "x": "\\ud800"}',             # a lone surrogate outside the named fields: Python reads it
    ])
    assert got == [
        (("string", "string", "boolean"), ("Ada", "SWE", "true")),
        (("string", "null", "boolean"), ("Zoë é\U0001f600", None, "false")),
        (("other", "other", "other"), (None, None, None)),
        ((None, None, None), (None, None, None)),
        (("string", None, None), ("A", None, None)),
    ]


@pytest.mark.parametrize("value, why", [
    (None, "a tombstone"),
    (b"", "empty"),
    (b'\xef\xbb\xbf{"name": "A"}', "a byte-order mark (json.loads refuses it)"),
    ('{"name": "A"}'.encode("utf-16-le"), "UTF-16 (Jackson would detect it from bytes)"),
    (b'{"name": "caf\xe9"}', "not UTF-8"),
    (b'{"name": "\xc0\xaf"}', "overlong UTF-8"),
    (b'{"name": "\xed\xa0\x80"}', "a surrogate in UTF-8"),
    (b'{"name": "A", "name": "B"}', "a named field twice"),
    (b'{"name": "A", "n\\u0061me": "B"}', "a named field twice, once escaped"),
    (b'{"name": "\\udc00x"}', "a lone surrogate in a named field"),
    (b'{"name": "A"} {"name": "B"}', "a second object"),
    (b'{"name": "A"}]', "text after the object"),
    (b'[{"name": "A"}]', "not an object"),
    (b'{"name": "A", "x": NaN}', "NaN"),
    (b'{"name": "A", "x": 01}', "a leading zero"),
    (b'{"name": "A",}', "a trailing comma"),
    (b"{'name': 'A'}", "single quotes"),
    (b'{"name": "A" /* c */}', "a comment"),
    (b'{"name": "a\tb"}', "a control character in a string"),
    (b'{"name": "A", "x": ' + b"[" * 64 + b"]" * 64 + b"}", "nesting past 64 levels"),
    (b'{"name": "A", "x": ' + b"1" * 1001 + b"}", "a number past 1000 characters"),
])
def test_what_it_leaves_to_the_exact_parser(spark, value, why):
    assert read(spark, [value]) == [None], why


def test_the_limits_themselves_are_read(spark):
    deep = b'{"name": "A", "x": ' + b"[" * 63 + b"]" * 63 + b"}"
    long = b'{"name": "A", "x": ' + b"1" * 1000 + b"}"
    assert read(spark, [deep, long]) == [(("string", None, None), ("A", None, None))] * 2
