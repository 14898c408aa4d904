"""A pipeline's checks gate promote: named SQL with limits, refused naming the check, the value and
the limit; --force with a reason, audited; a schema change refused unless allowed; a check that
does not parse or names an unknown column refused at deploy time (`check_pipeline_checks`)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from control_helpers import ALIAS, PIPELINE, make_spec, ready_version
from orchestrator.core.checks import CheckSpec, run_checks, validate_checks
from orchestrator.core.exceptions import ConfigError, NotReadyError
from orchestrator.lifecycle.deploy import check_request
from orchestrator.lifecycle.promote import promote
from orchestrator.lifecycle.report import check_pipeline_checks, validation_report
from orchestrator.serving import resolve_alias

ROWS_V1 = [("m1", "swe", "SWE", "Ada", 1), ("m2", "sr swe", "Sr SWE", "Alan", 2), ("m3", "pm", "PM", "Grace", 3),
           ("m4", "ceo", "CEO", "Linus", 4)]
ROWS_V2 = [("m1", "swe", "Software Engineer", "Ada", 1), ("m2", "sr swe", "Senior Software Engineer", "Alan", 2),
           ("m3", "pm", None, "Grace", 3), ("m4", "ceo", "CEO", "Linus", 4)]

NULL_RATE = CheckSpec(name="title_null_rate", max=0.1,
                      sql="SELECT avg(CASE WHEN title IS NULL THEN 1.0 ELSE 0 END) FROM candidate")
CHANGED = CheckSpec(name="titles_changed", max=0.2,
                    sql="SELECT count(*) * 1.0 / (SELECT count(*) FROM candidate) FROM diff WHERE column_name = 'title'")
NO_REJECTED_SERVED_KEY = CheckSpec(
    name="no_rejected_served_key", max=0,
    sql="SELECT count(*) FROM candidate_rejects r JOIN serving s ON CAST(r.key AS VARCHAR) = s.member_id")


@pytest.fixture
def spec():
    return make_spec(checks=(NULL_RATE, CHANGED, NO_REJECTED_SERVED_KEY))


def test_a_failed_check_refuses_the_promote_naming_the_check_its_value_and_its_limit(k, fake_log):
    v1 = ready_version(k, fake_log, ROWS_V1)
    first = promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    assert {c.name: c.ok for c in first.checks} == {"ready": True, "key_count": True, "reject_rate": True,
                                                   "title_null_rate": True, "titles_changed": True,
                                                   "no_rejected_served_key": True}
    v2 = ready_version(k, fake_log, ROWS_V2)
    dry = promote(k.version(PIPELINE, v2), actor="bob", reason="new rules", dry_run=True)
    assert not dry.would_succeed and dry.actions == []
    with pytest.raises(NotReadyError) as e:
        promote(k.version(PIPELINE, v2), actor="bob", reason="new rules")
    assert str(e.value) == (
        f"cannot promote {PIPELINE} v{v2} to alias {ALIAS!r}: title_null_rate: 0.25 outside its limit (max 0.1); "
        f"titles_changed: 0.75 outside its limit (max 0.2)")
    assert e.value.failed_checks == ("title_null_rate", "titles_changed")
    assert resolve_alias(ALIAS, k.settings)["version"] == v1
    report = validation_report(k.version(PIPELINE, v2), save=False)
    assert [(c.name, c.value) for c in report.checks if not c.builtin] == [
        ("title_null_rate", 0.25), ("titles_changed", 0.75), ("no_rejected_served_key", 0.0)]


def test_force_needs_a_reason_overrides_failed_checks_and_is_audited(k, fake_log):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    with pytest.raises(ConfigError, match=r"with --force needs a reason"):
        promote(k.version(PIPELINE, v2), actor="bob", force=True)
    res = promote(k.version(PIPELINE, v2), actor="bob", reason="the null title is expected for m3", force=True)
    assert res.flipped and res.forced == ["title_null_rate", "titles_changed"]
    assert "forced past failed check(s): title_null_rate, titles_changed" in res.message
    entry = k.registry.audit_log(PIPELINE, action="promote")[-1]
    assert (entry.outcome, entry.reason, entry.details["forced"]) == (
        "ok", "the null title is expected for m3", ["title_null_rate", "titles_changed"])
    assert resolve_alias(ALIAS, k.settings)["version"] == v2


def test_readiness_cannot_be_forced(k, fake_log):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V1, state="backfilling")
    k.registry.add_lag_sample(PIPELINE, v2, 500, {})
    with pytest.raises(NotReadyError, match=r"ready: "):
        promote(k.version(PIPELINE, v2), actor="bob", reason="hurry", force=True)
    assert resolve_alias(ALIAS, k.settings)["version"] == v1


def test_a_removed_column_is_refused_unless_allowed(k, fake_log):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V1)
    table = k.paths(PIPELINE, v2).table
    from deltalake import DeltaTable

    rows = DeltaTable(str(table)).to_pyarrow_table().drop_columns(["name"])
    rows = rows.set_column(rows.schema.get_field_index("source_offset"), "source_offset",
                           pa.array(rows["source_offset"].to_pylist(), pa.int32()))
    from deltalake import write_deltalake

    write_deltalake(str(table), rows, mode="overwrite", schema_mode="overwrite")
    with pytest.raises(NotReadyError) as e:
        promote(k.version(PIPELINE, v2), actor="bob", reason="drop name")
    assert ("schema: columns removed: name; columns retyped: source_offset int64 -> int32 "
            f"(v{v1} -> v{v2}); readers of the alias may break: promote with --allow-schema-change if meant") in str(e.value)
    res = promote(k.version(PIPELINE, v2), actor="bob", reason="drop name", allow_schema_change=True)
    assert res.flipped
    schema = next(c for c in res.checks if c.name == "schema")
    assert schema.ok and schema.detail.startswith("allowed (--allow-schema-change): columns removed: name")
    assert (res.report.columns_removed, res.report.columns_retyped) == (["name"], {"source_offset": ["int64", "int32"]})


def test_checks_that_do_not_parse_or_name_unknown_columns_are_refused_in_one_line(k, fake_log):
    from orchestrator.context import Kappa

    assert check_pipeline_checks(k, k.pipeline(PIPELINE)) == "3 checks parse (no table yet to check their columns against)"
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    assert check_pipeline_checks(k, k.pipeline(PIPELINE)) == f"3 checks bind against the columns of v{v1}'s table"
    for sql, error in [("SELEC 1", "Parser Error: syntax error at or near \"SELEC\""),
                       ("SELECT avg(titel) FROM candidate", 'Binder Error: Referenced column "titel" not found'),
                       ("SELECT count(*) FROM candidates", "Catalog Error: Table with name candidates does not exist")]:
        bad = make_spec(checks=(CheckSpec(name="bad", sql=sql, max=1),))
        kk = Kappa(k.settings, registry=k.registry, pipelines={PIPELINE: bad})
        with pytest.raises(ConfigError) as e:
            check_pipeline_checks(kk, kk.pipeline(PIPELINE))
        line = str(e.value)
        assert "\n" not in line and line.startswith(f"pipeline {PIPELINE!r}, check 'bad': {error}"), line
        assert line.endswith("fix its sql in the pipelines file (tables: candidate, serving, candidate_rejects, "
                             "serving_rejects, diff)")
        with pytest.raises(ConfigError) as at_deploy:      # deploy refuses it the same way, nothing allocated
            check_request(kk, kk.pipeline(PIPELINE))
        assert str(at_deploy.value) == line
    assert [r.version for r in k.registry.list_versions(PIPELINE)] == [v1]


def test_check_specs_are_refused_with_what_to_fix():
    with pytest.raises(ValueError, match="has no limit; set min, max or both"):
        CheckSpec(name="x", sql="SELECT 1")
    with pytest.raises(ValueError, match="min 2.0 over max 1.0"):
        CheckSpec(name="x", sql="SELECT 1", min=2, max=1)
    with pytest.raises(ValueError, match="is the name of one of kappa's own checks"):
        CheckSpec(name="reject_rate", sql="SELECT 1", max=1)
    with pytest.raises(ValueError, match="names must be unique"):
        make_spec(checks=(NULL_RATE, NULL_RATE))


def test_a_check_returning_null_or_text_fails_with_what_it_returned():
    t = pa.table({"title": pa.array([], pa.string())})
    out = run_checks([CheckSpec(name="n", sql="SELECT max(title) FROM candidate", max=1),
                      CheckSpec(name="s", sql="SELECT 'high'", max=1),
                      CheckSpec(name="b", sql="SELECT true", min=1)], {"candidate": t})
    assert [(c.name, c.ok, c.detail) for c in out] == [
        ("n", False, "returned no value (NULL), limit max 1"),
        ("s", False, "did not run: returned 'high', not a number"),
        ("b", True, "1 within its limit (min 1)")]
    validate_checks(PIPELINE, [CheckSpec(name="n", sql="SELECT max(title) FROM candidate", max=1)], {"candidate": t.schema})
