"""`preview_rules` and the kappa_reprocess task around it: the new rules applied to the served table's raw
columns with the job's own engine, reported as the validation report reports a rebuilt version."""

from __future__ import annotations

import logging
from pathlib import Path

import airflow.sdk  # noqa: F401  Airflow configures logging on its first import: do it now, not under caplog
import pytest
from rules_helpers import ALIAS, PIPELINE, serve, standardized

from orchestrator.airflow import tasks
from orchestrator.core.exceptions import ConfigError, NotFoundError, RulesError, SinkError
from orchestrator.lifecycle.preview import preview_rules
from orchestrator.lifecycle.report import compare_tables

#: (member_id, title_raw, company_raw); what rules v2 changes against v1 is spelled out in the tests
ROWS = [
    ("m1", "Sr. Software Engineer", "acme"),   # v1's catch-all: Software Engineer; v2 keeps the seniority
    ("m2", "Developer", "Hooli"),              # v1: Software Developer; v2: Software Engineer
    ("m3", "developer", None),
    ("m4", "swe", "Globex"),                   # Software Engineer under both
    ("m5", "pm", "Wayne Ent."),                # v2 merges the company spelling into Wayne Enterprises
    ("m6", None, None),
    ("m7", "Senior SWE", "initech llc"),       # v1 keeps it raw; v2: Senior Software Engineer
]
TITLE_CHANGES = [
    {"old": "Software Developer", "new": "Software Engineer", "count": 2},
    {"old": "Senior SWE", "new": "Senior Software Engineer", "count": 1},
    {"old": "Software Engineer", "new": "Senior Software Engineer", "count": 1},
]


def test_preview_reports_what_the_new_rules_would_change_and_writes_nothing(k):
    pointer = serve(k, standardized(ROWS, "v1"))
    table = k.paths(PIPELINE, 1).table
    p = preview_rules(k, k.pipeline(PIPELINE), "v2")
    assert (p.pipeline, p.alias, p.rules_version, p.serving_version, p.serving_rules_version) == \
        (PIPELINE, ALIAS, "v2", 1, "v1")
    assert (p.table, p.delta_version, p.published_at) == (str(table), 0, pointer["published_at"])
    assert p.compared_columns == ["title", "company"] and p.input_columns == ["title_raw", "company_raw"]
    assert (p.rows_compared, p.rows_changed) == (7, 4 + 1)
    assert p.changed_by_column == {"title": 4, "company": 1}
    assert p.top_changes == {"title": TITLE_CHANGES,
                             "company": [{"old": "Wayne Ent.", "new": "Wayne Enterprises", "count": 1}]}
    assert not p.same_rules and 0 < p.seconds < 30
    # a preview changes nothing: no new Delta commit, no version, the same pointer
    from deltalake import DeltaTable

    assert DeltaTable(str(table)).version() == 0
    assert [v.version for v in k.registry.list_versions(PIPELINE)] == [1]
    assert (Path(k.settings.warehouse) / "_aliases" / f"{ALIAS}.json").read_text().count('"version": 1') == 1


def test_preview_counts_what_the_validation_report_of_the_rebuilt_version_counts(k):
    rows = ROWS + [(f"x{i}", t, c) for i, (t, c) in enumerate(
        [("sr swe", "wayne ent"), ("Software Dev", "ACME Corp"), ("ingénieur logiciel", None), ("cto", "stark")] * 3)]
    serve(k, standardized(rows, "v1"))
    p = preview_rules(k, k.pipeline(PIPELINE), "v2", top=3)
    report = compare_tables(standardized(rows, "v2"), standardized(rows, "v1"), ["member_id"], top=3)
    assert p.rows_changed == report["rows_changed"] > 0
    assert p.changed_by_column == report["changed_by_column"]
    assert p.top_changes == report["top_changes"] and len(p.top_changes["title"]) == 3


def test_the_served_rules_change_nothing(k):
    serve(k, standardized(ROWS, "v2"), rules_version="v2")
    p = preview_rules(k, k.pipeline(PIPELINE), "v2")
    assert (p.rows_changed, p.top_changes, p.same_rules) == (0, {}, True)
    assert p.changed_by_column == {"title": 0, "company": 0}


def test_preview_follows_the_alias_to_the_version_it_serves_now(k):
    serve(k, standardized(ROWS, "v1"))
    serve(k, standardized(ROWS, "v2"), rules_version="v2")
    p = preview_rules(k, k.pipeline(PIPELINE), "v1")
    assert (p.serving_version, p.serving_rules_version) == (2, "v2")
    assert p.changed_by_column == {"title": 4, "company": 1}
    assert p.top_changes["company"] == [{"old": "Wayne Enterprises", "new": "Wayne Ent.", "count": 1}]


def test_unknown_pipeline_nothing_served_and_bad_rules_versions_are_refused(k):
    with pytest.raises(NotFoundError, match=r"^unknown pipeline 'nope': the pipelines declared in "):
        preview_rules(k, k.pipeline("nope"), "v2")
    with pytest.raises(NotFoundError) as e:
        preview_rules(k, k.pipeline(PIPELINE), "v2")
    assert str(e.value) == (
        f"pipeline '{PIPELINE}' serves nothing yet (alias '{ALIAS}' is not published), so there is no table to "
        f"preview rules v2 on; deploy and promote a first version (`kappa deploy {PIPELINE} --rules v2 --wait`, "
        f"then `kappa promote {PIPELINE}`)")
    serve(k, standardized(ROWS, "v1"))
    with pytest.raises(RulesError, match=r"^no rules file .*/titles/v9\.toml: ruleset 'titles' has versions v1, v2; "):
        preview_rules(k, k.pipeline(PIPELINE), "v9")
    with pytest.raises(RulesError, match=r"^invalid rules version '\.\./v1'"):
        preview_rules(k, k.pipeline(PIPELINE), "../v1")
    with pytest.raises(ConfigError, match=r"^pipeline 'pageviews_hourly' \(job 'pageviews_hourly'\) takes no rules"):
        preview_rules(k, k.pipeline("pageviews_hourly"), "v2")


def test_a_served_table_without_raw_columns_is_refused_by_name(k):
    serve(k, standardized(ROWS, "v1").drop_columns(["title_raw", "company_raw"]))
    with pytest.raises(SinkError) as e:
        preview_rules(k, k.pipeline(PIPELINE), "v2")
    assert str(e.value) == (
        f"the table {k.paths(PIPELINE, 1).table} that alias '{ALIAS}' serves ({PIPELINE} v1) keeps no raw column "
        f"beside its derived one (title_raw and title, company_raw and company); a rules preview needs the raw "
        f"values the rules apply to")


# -- the kappa_reprocess task -------------------------------------------------------------------

@pytest.fixture
def task_env(k, monkeypatch):
    """The environment `kappa airflow start` gives the tasks: KAPPA_HOME of the same home as `k`."""
    monkeypatch.setenv("KAPPA_HOME", str(k.settings.home))
    return k


def test_the_task_logs_the_preview_and_returns_it(task_env, caplog):
    serve(task_env, standardized(ROWS, "v1"))
    with caplog.at_level(logging.INFO, logger="kappa.airflow"):
        out = tasks.preview_rules(PIPELINE, "v2")
    assert out["previewed"] is True and out["rows_changed"] == 5 and out["top_changes"]["title"] == TITLE_CHANGES
    lines = [r.getMessage() for r in caplog.records if r.name == "kappa.airflow"]
    # what `kappa rules preview` prints, as text lines a task log shows whole (JSON lines were cut at its edge),
    # each sentence on one line: never hard-wrapped ("compared in / 3.13 s", "v1 now -> rules / v2": issue 30)
    assert lines[0] == f"rules preview: {PIPELINE} rules v2 against served v1 (rules v1), alias {ALIAS}"
    assert "  rows the new rules would change: 5 (title: 4, company: 1)" in lines
    assert any(line.startswith("  table ") and line.endswith(" s") and "rows read and compared in " in line
               for line in lines), lines
    assert "top changes of title: v1 now -> rules v2" in lines
    assert all('{"old"' not in line for line in lines), lines
    rows = [line for line in lines if "│" in line]
    for old, new, count in (("Software Developer", "Software Engineer", 2), ("Senior SWE", "Senior Software Engineer", 1),
                            ("Wayne Ent.", "Wayne Enterprises", 1)):
        assert any(f"{count} │ {old} " in row and f"│ {new} " in row for row in rows), (old, rows)


def test_the_task_lets_a_first_reprocess_go_on(task_env, caplog):
    with caplog.at_level(logging.INFO, logger="kappa.airflow"):
        out = tasks.preview_rules(PIPELINE, "v1")
        none = tasks.preview_rules("pageviews_hourly", None)
    assert out == {"previewed": False, "reason": out["reason"]} and "serves nothing yet" in out["reason"]
    assert none == {"previewed": False, "reason": "pipeline 'pageviews_hourly' takes no rules"}
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
    assert caplog.records[0].getMessage() == f"no rules preview (the reprocess goes on): {out['reason']}"


def test_the_task_does_not_block_a_reprocess_when_the_served_table_is_unreadable(task_env, caplog):
    serve(task_env, standardized(ROWS, "v1"))
    pointer_file = Path(task_env.settings.warehouse) / "_aliases" / f"{ALIAS}.json"
    pointer_file.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="kappa.airflow"):
        out = tasks.preview_rules(PIPELINE, "v2")
    assert out["previewed"] is False and out["reason"].startswith(f"the alias pointer file {pointer_file} is damaged")
    assert caplog.records[-1].getMessage().startswith("no rules preview (the reprocess goes on): the alias pointer")
