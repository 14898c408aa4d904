"""A reprocess that spares the live version, from the real Airflow UI in headless Debian Chromium
(issue 32): the reprocess form shows each pipeline's backfill estimate; the operator changes the
share of a running backfill with the kappa_throttle form, and `kappa status` (the real command, in a
terminal's environment) shows the share, its mode and who set it; the kernel shows it too, as the
nice value of every thread of the backfill's job.

The backfill is held before its Delta commit by the jobs' test hook, so it is backfilling for as long
as the UI takes. Screenshots of the form and of the run go to the test artifacts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from airflow_helpers import RECORDS, RUN_TIMEOUT, choose, log_in, wait_for_new_run

from jobs.lib.sink.batches import HOLD_FILE, HOLD_HOOK
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.browser]

PIPELINE = "af_share"


def test_a_running_backfill_s_share_changed_from_the_ui_shows_in_status(airflow, stack_jobs_stopped, browser_page,
                                                                       artifacts_dir, monkeypatch, tmp_path):
    from orchestrator.airflow.client import follow
    from orchestrator.core.shares import share_to_nice
    from orchestrator.jobctl import inspect_version
    from orchestrator.jobctl.priority import job_processes, thread_nice
    from orchestrator.lifecycle.deploy import deploy

    bed = stack_jobs_stopped
    page = browser_page
    client = airflow.client()
    client.set_paused("kappa_throttle", False)
    known = {r["dag_run_id"] for r in client.list_runs("kappa_throttle")["dag_runs"]}

    held = tmp_path / "held"
    monkeypatch.setenv(HOLD_HOOK, "0")
    monkeypatch.setenv(HOLD_FILE, str(held))
    with bed.kappa() as k:
        info = deploy(k, k.pipeline(PIPELINE), None, actor="tests", reason="a backfill to throttle from the UI")
    monkeypatch.delenv(HOLD_HOOK)
    with bed.kappa() as k:
        v = k.version(PIPELINE, info.version)
        wait_until(lambda: held.exists() or inspect_version(v).failed, "the backfill read and held", 300)
        assert held.exists(), inspect_version(v).error

    log_in(page, airflow.url)
    # the reprocess form: each pipeline with its backfill estimate (made when the DAG file was parsed: the
    # log's 300 records at the default rate, no version of af_share having been measured)
    page.goto(f"{airflow.url}/dags/kappa_reprocess")
    page.get_by_label("Trigger Dag").first.click()
    page.get_by_role("combobox", name="Pipeline").click()
    offered = [o.inner_text().strip() for o in page.get_by_role("option").all()]
    label = next((o for o in offered if o.startswith(f"{PIPELINE}: ")), None)
    assert label is not None and re.fullmatch(
        rf"{PIPELINE}: backfill ~\d+ s \({RECORDS} records at most, \d+ cores; default rate, no earlier version "
        rf"measured\)", label), offered
    page.screenshot(path=str(artifacts_dir / "airflow_reprocess_form_estimates.png"), full_page=True)
    page.keyboard.press("Escape")

    page.goto(f"{airflow.url}/dags/kappa_throttle")
    page.get_by_label("Trigger Dag").first.click()
    choose(page, "Pipeline", PIPELINE)
    page.locator("input[name=element_version]").fill(str(info.version))   # a number field: its input has the name
    page.locator("input[name=element_share]").fill("0.25")
    page.fill("#element_reason", "the live version comes first")
    page.screenshot(path=str(artifacts_dir / "airflow_throttle_form.png"), full_page=True)
    submit = page.get_by_test_id("trigger-dag-submit")
    assert submit.is_enabled()
    submit.click()

    run_id = wait_for_new_run(client, "kappa_throttle", known, timeout=60)
    outcome = follow(client, "kappa_throttle", run_id, timeout=RUN_TIMEOUT, poll_seconds=2)
    assert outcome.ok, f"{outcome.error}\n" + "\n".join(line for t in outcome.tasks for line in t.log_tail)
    page.goto(outcome.url)
    page.get_by_text("success").first.wait_for(timeout=60_000)
    page.screenshot(path=str(artifacts_dir / "airflow_throttle_run.png"), full_page=True)

    status = subprocess.run([sys.executable, "-m", "orchestrator.cli", "status", PIPELINE],
                            env={**os.environ, **bed.env(), "COLUMNS": "200"}, capture_output=True, text=True,
                            timeout=120)
    assert status.returncode == 0, status.stderr
    line = next((ln for ln in status.stdout.splitlines() if f"v{info.version} share" in ln), None)
    assert line is not None, status.stdout
    assert f"v{info.version} share 0.25 (nice {share_to_nice(0.25)}), fixed" in line and "airflow:admin" in line, line
    assert "the live version comes first" in status.stdout, status.stdout

    with bed.kappa() as k:
        rec = k.registry.get_version(PIPELINE, info.version)
        assert rec.state in ("starting", "backfilling") and rec.details["throttle"]["share"] == 0.25   # not serving
        nices = {thread_nice(int(t)) for p in job_processes(rec.pid) for t in os.listdir(f"/proc/{p}/task")} - {None}
        assert nices == {share_to_nice(0.25)}, nices
    held.unlink()
    assert (artifacts_dir / "airflow_throttle_form.png").stat().st_size > 10_000
