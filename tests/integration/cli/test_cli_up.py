"""`kappa up` end to end, as a new user meets it: one command, then the Airflow UI in headless Debian
Chromium. The command brings up the embedded broker with the profile changelog and live updates,
v1 serving and Airflow, and prints the URL and login. In the UI: trigger kappa_reprocess with the
v2 rules (both dropdowns of the form chosen), see v2 promoted by the run, roll back with kappa_rollback. Then Ctrl-C (SIGINT): everything it
started (Airflow's components, the jobs, the broker) is stopped, by PID, and it says so.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.browser]

KAPPA = [sys.executable, "-m", "orchestrator.cli"]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
UP_TIMEOUT = 900.0
RUN_TIMEOUT = 600.0


class Output:
    """The lines a process prints, collected by a thread; `wait_for` a pattern."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines = proc, []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            if self.proc.poll() is not None:
                self.thread.join(5)
                pytest.fail(f"kappa up exited with {self.proc.returncode} before printing {pattern!r}:\n{self.text()[-6000:]}")
            time.sleep(0.5)
        pytest.fail(f"kappa up did not print {pattern!r} in {timeout:.0f} s:\n{self.text()[-6000:]}")


def choose(page, label: str, option_text: str) -> None:
    """Pick an option of one of the form's dropdowns (a combobox labelled like the Param's title)."""
    page.get_by_role("combobox", name=label).click()
    page.get_by_role("option", name=option_text, exact=True).click()


def trigger_from_the_form(page, url: str, dag_id: str, reason: str, rules_label: str | None = None,
                          screenshot: Path | None = None) -> None:
    page.goto(f"{url}/dags/{dag_id}")
    page.get_by_label("Trigger Dag").first.click()
    choose(page, "Pipeline", "standardize")
    if rules_label:
        choose(page, "Rules version", rules_label)
        assert page.locator("input[name=element_rules_version]").input_value() == rules_label.split()[0]
    page.fill("#element_reason", reason)
    assert page.locator("input[name=element_pipeline]").input_value() == "standardize"
    if screenshot is not None:
        page.screenshot(path=str(screenshot), full_page=True)
        assert screenshot.stat().st_size > 10_000
    submit = page.get_by_test_id("trigger-dag-submit")
    assert submit.is_enabled()
    submit.click()


def served_version(home: Path) -> int | None:
    from orchestrator.registry import Registry

    reg = Registry(f"sqlite:///{home / 'registry.db'}")
    try:
        alias = reg.get_alias("member_profiles_std")
        return None if alias is None else alias.version
    finally:
        reg.close()


def version_record(home: Path, version: int):
    from orchestrator.registry import Registry

    reg = Registry(f"sqlite:///{home / 'registry.db'}")
    try:
        return reg.get_version("standardize", version)
    finally:
        reg.close()


def test_kappa_up_then_reprocess_and_roll_back_in_the_ui(tmp_path, artifacts_dir):
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"Debian's chromium is expected at {CHROMIUM}: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    from orchestrator.airflow.client import AirflowClient

    home = tmp_path / "up"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAPPA_", "AIRFLOW"))}
    proc = subprocess.Popen([*KAPPA, "up", "--home", str(home), "--records", "3000", "--keys", "500", "--rate", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    out = Output(proc)
    try:
        m = out.wait_for(r"Airflow UI: (http://127\.0\.0\.1:\d+)  \(login admin / admin\)", UP_TIMEOUT)
        url = m.group(1)
        out.wait_for(r"Press Ctrl-C to stop everything kappa up started\.", 60)  # printed after the URL
        assert "serving: alias member_profiles_std -> standardize v1 (rules v1)" in out.text()
        client = AirflowClient(url, "admin", "admin")
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
                viewport={"width": 1400, "height": 1100})
            try:
                page = context.new_page()
                page.goto(f"{url}/auth/login?next=/")
                page.fill("input[name=username]", "admin")
                page.fill("input[name=password]", "admin")
                page.keyboard.press("Enter")
                page.wait_for_url(lambda u: "/auth/login" not in u, timeout=60_000)

                trigger_from_the_form(page, url, "kappa_reprocess", "new title rules, from kappa up", "v2 (titles)",
                                      screenshot=artifacts_dir / "kappa_up_reprocess_form.png")
                wait_until(lambda: served_version(home) == 2, "the reprocess run to promote v2", RUN_TIMEOUT, poll=3)
                (run,) = client.list_runs("kappa_reprocess")["dag_runs"]
                assert run["conf"]["rules_version"] == "v2" and run["conf"]["pipeline"] == "standardize"
                v2 = version_record(home, 2)
                assert v2.actor == "airflow:admin" and run["dag_run_id"] in v2.reason, (v2.actor, v2.reason)
                page.goto(client.ui_run_url("kappa_reprocess", run["dag_run_id"]))
                page.get_by_text("success").first.wait_for(timeout=120_000)
                page.screenshot(path=str(artifacts_dir / "kappa_up_reprocess_run.png"), full_page=True)

                trigger_from_the_form(page, url, "kappa_rollback", "v2 titles look wrong, from kappa up")
                wait_until(lambda: served_version(home) == 1, "the rollback run to serve v1 again", RUN_TIMEOUT, poll=3)
                (rollback,) = client.list_runs("kappa_rollback")["dag_runs"]
                wait_until(lambda: client.get_run("kappa_rollback", rollback["dag_run_id"])["state"] == "success",
                           "the rollback run to succeed", 120, poll=2)
            finally:
                context.close()
        stack_pids = [int(p) for p in re.findall(r"(?:api-server|scheduler|dag-processor|triggerer) (\d+)",
                                                 out.wait_for(r"Airflow runs, logs in .*; pids (.*)", 5).group(1))]
        assert len(stack_pids) == 4
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)    # what Ctrl-C sends
        try:
            proc.wait(240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            pytest.fail(f"kappa up did not stop within 240 s of Ctrl-C:\n{out.text()[-6000:]}")
        out.thread.join(10)
    text = out.text()
    assert proc.returncode == 0, text[-6000:]
    assert "nothing left running" in text, text[-4000:]
    stopped = {int(pid) for pid in re.findall(r"^stopped .* \(pid (\d+)\)$", text, re.M)}
    assert set(stack_pids) <= stopped
    assert any(line.startswith("stopped broker (pid") for line in text.splitlines())
    assert any(re.match(r"stopped standardize v2 job", line) for line in text.splitlines())
    for pid in stopped:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
