"""Airflow integration fixtures: kappa's test pipelines on the session broker, an in-process
Airflow database for `dag.test()`, and one real Airflow stack for the whole session.

AIRFLOW_HOME (for the in-process Airflow of `dag.test()`) is set before anything imports Airflow,
shared with the unit conftest through KAPPA_TEST_AIRFLOW_HOME. The real stack has its own
AIRFLOW_HOME under the test kappa home; both read this repository's dags/.

Every test pipeline reads its own compacted topic and serves its own alias, so tests do not
depend on each other's versions. The settings name a team's repository (`tests/team_repo.py`) as the
job path and the rules location: pipeline `af_team` runs the team's job with the team's rules. The topics hold tombstones and malformed records, generated
from the logged `session_seed` (rerun with KAPPA_TEST_SEED=<seed>). The Spark jobs a test started
are stopped after it (by PID, through kappa's lifecycle); the stack is stopped by its PIDs after the
last test of this folder, so that its four processes do not take CPU from the rest of the suite.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from orchestrator.airflow.stack import airflow_env

if not os.environ.get("KAPPA_TEST_AIRFLOW_HOME"):
    os.environ["KAPPA_TEST_AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="kappa-airflow-test-")
    atexit.register(shutil.rmtree, os.environ["KAPPA_TEST_AIRFLOW_HOME"], True)
os.environ.update(airflow_env(Path(os.environ["KAPPA_TEST_AIRFLOW_HOME"])))

from airflow_helpers import (CHROMIUM, CHROMIUM_FLAGS, DELETE_SHARE, KEYS, MALFORMED_SHARE, PIPELINES,  # noqa: E402
                             POKE_SECONDS, RECORDS, TEAM, AirflowTestBed, pipelines_toml, stop_all_jobs)


@pytest.fixture(scope="session")
def airflow_testbed(tmp_path_factory, bootstrap, session_seed) -> AirflowTestBed:
    from orchestrator.dev import datagen
    from orchestrator.core.settings import Settings
    from tests import team_repo

    home = tmp_path_factory.mktemp("kappa-af")
    suffix = uuid.uuid4().hex[:8]
    topics = {name: f"{name}_{suffix}" for name in PIPELINES}
    pipelines_file = home / "pipelines.toml"
    pipelines_file.write_text(pipelines_toml(topics))
    for i, (name, topic) in enumerate(topics.items()):
        datagen.ensure_topic(bootstrap, topic, partitions=2)
        datagen.produce(bootstrap, topic, team_repo.accounts(RECORDS, KEYS // 4, session_seed + i) if name == TEAM
                        else datagen.generate_changelog(RECORDS, KEYS, seed=session_seed + i,
                                                        malformed_share=MALFORMED_SHARE, delete_share=DELETE_SHARE))
    job_path, rules = team_repo.write_team_repo(home)   # the team's repository: its job and rules (and titles)
    settings = Settings(home=home / "kappa", pipelines_file=pipelines_file, bootstrap_servers=bootstrap,
                        job_path=str(job_path), rules_location=str(rules))
    return AirflowTestBed(settings=settings, bootstrap=bootstrap, topics=topics)


@pytest.fixture
def in_process_kappa(airflow_testbed, monkeypatch) -> AirflowTestBed:
    """The test kappa home as this process's settings (what in-process tasks resolve); jobs stopped after."""
    for var, value in airflow_testbed.env().items():
        monkeypatch.setenv(var, value)
    try:
        yield airflow_testbed
    finally:
        stop_all_jobs(airflow_testbed)


@pytest.fixture(scope="session")
def airflow_db():
    """`airflow db migrate` for the in-process Airflow that `dag.test()` runs in."""
    from orchestrator.airflow.stack import migrate

    home = Path(os.environ["KAPPA_TEST_AIRFLOW_HOME"])
    migrate(airflow_env(home), home / "migrate.log")
    return home


_HERE = Path(__file__).parent
_STACKS: list = []  # the session stack, while it runs


def pytest_runtest_teardown(item, nextitem):
    """Stop the session stack once no test of this folder is left to run (the fixture's own
    teardown would only run at the end of the whole session)."""
    if _STACKS and (nextitem is None or _HERE not in Path(str(nextitem.path)).parents):
        _STACKS.pop().stop()


@pytest.fixture(scope="session")
def executor_ctl(tmp_path_factory) -> Path:
    """The control folder of the test hook in the stack's scheduler (`executor_hook/sitecustomize.py`):
    inert while empty."""
    return tmp_path_factory.mktemp("executor-ctl")


@pytest.fixture(scope="session")
def airflow(airflow_testbed, executor_ctl):
    """One Airflow (api-server, scheduler, dag-processor, triggerer) for the session, its scheduler with
    the executor test hook on its path.

    DAGs start paused so that kappa_monitor stays off; the three manual DAGs are unpaused.
    """
    from orchestrator.airflow import stack as airflow_stack

    hook_path = os.pathsep.join(p for p in (str(_HERE / "executor_hook"), os.environ.get("PYTHONPATH")) if p)
    stack = airflow_stack.start(airflow_testbed.settings, paused_at_creation=True, timeout=400,
                                extra_env={"KAPPA_AIRFLOW_POKE_SECONDS": POKE_SECONDS, "PYTHONPATH": hook_path,
                                           "KAPPA_TEST_EXECUTOR_CTL": str(executor_ctl)})
    try:
        client = stack.client()
        for dag_id in ("kappa_reprocess", "kappa_promote", "kappa_rollback"):
            client.set_paused(dag_id, False)
        _STACKS.append(stack)
        yield stack
    finally:
        if stack in _STACKS:  # else the hook above stopped it
            _STACKS.remove(stack)
            stack.stop()
        stop_all_jobs(airflow_testbed)


@pytest.fixture
def stack_jobs_stopped(airflow_testbed):
    """Jobs that runs of the real stack started are stopped after the test."""
    try:
        yield airflow_testbed
    finally:
        stop_all_jobs(airflow_testbed)


@pytest.fixture
def browser_page(tmp_path):
    """A page of Debian's headless Chromium (Playwright drives it; never `playwright install`)."""
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"Debian's chromium is expected at {CHROMIUM}: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1100})
        try:
            yield context.new_page()
        finally:
            context.close()
