"""`jobs.lib.source.json_values.parse_json_values` refuses field names the JVM's reading cannot carry, in one
line, before it touches Spark (the names travel to `kappa_json_fields` as one comma-separated string)."""

from __future__ import annotations

import pytest

from jobs.lib.source.json_values import parse_json_values


class _Untouched:
    """A stand-in for the records: any use of it fails the test (a refusal must come before Spark's work)."""

    def __getattr__(self, name):
        raise AssertionError(f"parse_json_values used the records ({name}) before refusing the field names")


@pytest.mark.parametrize("fields, named", [(["name", "first,last"], "['first,last']"),
                                           (["", "title"], "['']"),
                                           (["a,b", "", "ok"], "['a,b', '']")])
def test_field_names_with_a_comma_or_empty_are_refused_in_one_line(fields, named):
    with pytest.raises(ValueError) as e:
        parse_json_values(_Untouched(), keep=["key"], fields=fields, key_ok=lambda: None,
                          judge=lambda doc: (None, {}), exact=lambda k, v: {}, exact_ddl="error string", name="t")
    assert str(e.value) == (f"parse_json_values: field names {named} cannot be read (empty, or with a comma): name "
                            f"each field as the JSON object spells it, and read a field whose name holds a comma from "
                            f"the record's value yourself")
    assert "\n" not in str(e.value)
