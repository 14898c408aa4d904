"""Shared by the Airflow integration tests: the test bed, exact table checks, job clean-up."""

from __future__ import annotations

from dataclasses import dataclass

from tests.pipelines import standardize_pipeline

#: One pipeline per test scenario. Two samples at lag 0 make a version ready; no standby grace.
PIPELINES = ("af_dagtest", "af_busy", "af_flip", "af_conn", "af_team", "af_share", "af_race")
#: The team's pipeline: its job and rules come from a repository outside kappa (`tests/team_repo.py`).
TEAM = "af_team"
RECORDS, KEYS = 300, 200
#: Of the records after the first KEYS (which create each member once): tombstones and malformed
#: records (rejects), so that every DAG run meets both; the pipelines allow this reject rate.
DELETE_SHARE, MALFORMED_SHARE, MAX_REJECT_RATE = 0.05, 0.15, 0.25
#: The sensors poke every 3 s (kappa's floor is 2: orchestrator.airflow.params.MIN_POKE_SECONDS).
POKE_SECONDS = "3"
RUN_TIMEOUT = 420.0


@dataclass(frozen=True)
class AirflowTestBed:
    settings: object   # orchestrator.core.settings.Settings of the test kappa home
    bootstrap: str
    topics: dict       # pipeline -> topic

    def alias(self, pipeline: str) -> str:
        return f"{pipeline}_served"

    def env(self) -> dict[str, str]:
        from orchestrator.airflow.stack import kappa_env

        return {**kappa_env(self.settings), "KAPPA_AIRFLOW_POKE_SECONDS": POKE_SECONDS}

    def kappa(self):
        from orchestrator.context import Kappa

        return Kappa(self.settings)


def pipelines_toml(topics: dict[str, str]) -> str:
    """The test pipelines: standardize jobs, two samples at lag 0 make a version ready, no standby grace,
    the test data's share of malformed records allowed."""
    out = []
    for name, topic in topics.items():
        if name == TEAM:
            out.append(f'[pipelines.{name}]\njob = "team_jobs.accounts:transform"\ntopics = ["{topic}"]\n'
                       f'key = "account_id"\nruleset = "plans"\nalias = "{name}_served"\ncatchup_threshold = 0\n'
                       f'catchup_samples = 2\ngrace_period_seconds = 0\nmax_reject_rate = {MAX_REJECT_RATE}\n')
            continue
        out.append(standardize_pipeline(name, topic, grace_period_seconds=0, keep_versions=None,
                                        max_reject_rate=MAX_REJECT_RATE))
    return "\n".join(out)


def stop_all_jobs(bed: AirflowTestBed) -> list[str]:
    """Stop every version job of the test pipelines that still runs (kappa's lifecycle, by PID): all asked
    first, then each waited for, as `kappa up` ends its jobs (a teardown waits for the slowest, not the sum)."""
    from orchestrator.jobctl import inspect_version
    from orchestrator.jobctl.stop import finish_stop, request_stop

    requests = []
    with bed.kappa() as k:
        for name in PIPELINES:
            for rec in k.registry.list_versions(name):
                if inspect_version(k.version(name, rec.version)).alive:
                    requests.append(request_stop(k.version(name, rec.version), actor="tests", reason="test teardown",
                                                 force=True, bound=20, final_state=None))
        for req in requests:
            finish_stop(req)
    return [f"{req.pipeline} v{req.version}" for req in requests]


def served_diff(bed: AirflowTestBed, pipeline: str, rules_version: str) -> str | None:
    """None when the table the pipeline's alias serves (read through the pointer file), and the
    rejects of the version it serves, equal exactly what the oracle computes from the topic under
    `rules_version` (every column, the literal schema, full reject reasons); else what differs."""
    from orchestrator.serving import resolve_alias
    from tests.served import served_diff as diff

    pointer = resolve_alias(bed.alias(pipeline), bed.settings)
    with bed.kappa() as k:
        rejects = k.paths(pointer["pipeline"], pointer["version"]).rejects
    why, _rows = diff(bed.settings, bed.alias(pipeline), bed.bootstrap, bed.topics[pipeline], rules_version, rejects)
    return why


def expected(bed: AirflowTestBed, pipeline: str, rules_version: str):
    """The oracle's `Expected` (table, rejects) for the pipeline's topic under `rules_version`."""
    from tests.served import expected_from_log

    return expected_from_log(bed.bootstrap, bed.topics[pipeline], rules_version)[0]


# -- the browser: Debian's Chromium driven by Playwright (the `browser_page` fixture in conftest) ---

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def log_in(page, url: str) -> None:
    """Log in to the Airflow UI as the stack's admin."""
    page.goto(f"{url}/auth/login?next=/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "admin")
    page.keyboard.press("Enter")
    page.wait_for_url(lambda u: "/auth/login" not in u, timeout=60_000)


def option_name(option_text: str):
    """An option's accessible name: the value itself, or the value and what the form says of it after a
    colon (the reprocess form's pipelines: 'standardize: backfill ~35 s (...)')."""
    import re

    return re.compile(rf"^{re.escape(option_text)}(: .*)?$")


def choose(page, label: str, option_text: str) -> None:
    """Pick an option of one of the form's dropdowns (a combobox labelled like the Param's title)."""
    box = page.get_by_role("combobox", name=label)
    box.click()
    page.get_by_role("option", name=option_name(option_text)).click()


def wait_for_new_run(client, dag_id: str, known: set[str], timeout: float) -> str:
    """The id of the one run of `dag_id` not in `known` (a form was just submitted)."""
    from tests.waiting import wait_until

    def new_runs() -> list[str]:
        return [r["dag_run_id"] for r in client.list_runs(dag_id)["dag_runs"] if r["dag_run_id"] not in known]

    new = wait_until(new_runs, f"a new run of {dag_id} after submitting the form", timeout, poll=1)
    assert len(new) == 1, f"one submit, {len(new)} new runs: {new}"
    return new[0]
