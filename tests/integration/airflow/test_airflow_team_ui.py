"""A team's pipeline through the real Airflow UI in headless Debian Chromium: the stack's settings
name the team's repository as the job path and the rules location (`tests/team_repo.py`); the
trigger form offers the team's pipeline and its rules versions (`v3 (plans)`, a version only the
team's ruleset has); a reprocess with them runs the team's job and the alias serves exactly the table
the team's v3 rules give. Screenshots of the form and of the finished run go to the test artifacts."""

from __future__ import annotations

import pytest
from airflow_helpers import RUN_TIMEOUT, TEAM, choose, log_in, wait_for_new_run

from orchestrator.dev import datagen
from tests.team_repo import expected_accounts

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.browser]

PIPELINE = TEAM


def test_a_team_s_pipeline_and_rules_from_the_ui_form(airflow, stack_jobs_stopped, browser_page, artifacts_dir):
    from orchestrator.airflow.client import follow

    bed = stack_jobs_stopped
    page = browser_page
    client = airflow.client()
    known = {r["dag_run_id"] for r in client.list_runs("kappa_reprocess")["dag_runs"]}

    log_in(page, airflow.url)

    page.goto(f"{airflow.url}/dags/kappa_reprocess")
    page.get_by_label("Trigger Dag").first.click()
    choose(page, "Pipeline", PIPELINE)
    page.get_by_role("combobox", name="Rules version").click()
    offered = [o.inner_text().strip() for o in page.get_by_role("option").all()]
    assert {"v1 (plans, titles)", "v2 (plans, titles)", "v3 (plans)"} <= set(offered), offered
    page.get_by_role("option", name="v3 (plans)", exact=True).click()
    page.fill("#element_reason", "the team's plans v3 from the Airflow UI")
    assert page.locator("input[name=element_pipeline]").input_value() == PIPELINE
    assert page.locator("input[name=element_rules_version]").input_value() == "v3"
    page.screenshot(path=str(artifacts_dir / "airflow_team_reprocess_form.png"), full_page=True)
    submit = page.get_by_test_id("trigger-dag-submit")
    assert submit.is_enabled()
    submit.click()

    run_id = wait_for_new_run(client, "kappa_reprocess", known, timeout=60)
    outcome = follow(client, "kappa_reprocess", run_id, timeout=RUN_TIMEOUT, poll_seconds=3)
    assert outcome.ok, f"{outcome.error}\n" + "\n".join(line for t in outcome.tasks for line in t.log_tail)
    assert outcome.conf["pipeline"] == PIPELINE and outcome.conf["rules_version"] == "v3"

    page.goto(outcome.url)
    page.get_by_text("success").first.wait_for(timeout=60_000)
    page.screenshot(path=str(artifacts_dir / "airflow_team_reprocess_run.png"), full_page=True)

    from orchestrator.core.tables import read_table
    from orchestrator.serving import open_alias

    with bed.kappa() as k:
        alias = k.registry.get_alias(bed.alias(PIPELINE))
        assert alias is not None and alias.version == outcome.xcom["start_version"]["version"] == 1
        v1 = k.registry.get_version(PIPELINE, 1)
        assert v1.state == "serving" and v1.actor == "airflow:admin" and run_id in v1.reason
        assert v1.rules_version == "v3"
    table, _rejects = expected_accounts(list(datagen.iter_log(bed.bootstrap, bed.topics[PIPELINE])), "v3")
    served = read_table(open_alias(bed.alias(PIPELINE), bed.settings)).to_pylist()
    assert {r["account_id"]: (r["owner"], r["plan_raw"], r["plan"]) for r in served} == table
    assert "Starter" in {r["plan"] for r in served}
    assert (artifacts_dir / "airflow_team_reprocess_form.png").stat().st_size > 10_000
    assert (artifacts_dir / "airflow_team_reprocess_run.png").stat().st_size > 10_000
