"""Shared by the Airflow integration tests: the test bed, table checks, job clean-up."""

from __future__ import annotations

from dataclasses import dataclass

#: One pipeline per test scenario. Two samples at lag 0 make a version ready; no standby grace.
PIPELINES = ("af_dagtest", "af_rest", "af_busy", "af_ui")
RECORDS, KEYS = 300, 200
#: The sensors poke at Airflow's floor for kappa (see orchestrator.airflow.params.MIN_POKE_SECONDS).
POKE_SECONDS = "10"
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
        from orchestrator.core.kappa import Kappa

        return Kappa(self.settings)


def pipelines_toml(topics: dict[str, str]) -> str:
    """The test pipelines: standardize jobs, two samples at lag 0 make a version ready, no standby grace."""
    out = []
    for name, topic in topics.items():
        out.append(f'''[pipelines.{name}]
job = "standardize"
topics = ["{topic}"]
key = "member_id"
ruleset = "titles"
alias = "{name}_served"
catchup_threshold = 0
catchup_samples = 2
grace_period_seconds = 0
''')
    return "\n".join(out)


def stop_all_jobs(bed: AirflowTestBed) -> list[str]:
    """Stop every version job of the test pipelines that still runs (kappa's lifecycle, by PID)."""
    from orchestrator.jobctl import inspect_version, stop_version

    stopped = []
    with bed.kappa() as k:
        for name in PIPELINES:
            for rec in k.registry.list_versions(name):
                if inspect_version(k, name, rec.version).alive:
                    stop_version(k, name, rec.version, actor="tests", reason="test teardown", force=True,
                                 graceful_timeout=20, final_state=None)
                    stopped.append(f"{name} v{rec.version}")
    return stopped


def served_titles(bed: AirflowTestBed, pipeline: str) -> dict[str, str | None]:
    """member_id -> title of the table the pipeline's alias serves now (read through the pointer file)."""
    from orchestrator.serving import open_alias

    table = open_alias(bed.alias(pipeline), bed.settings).to_pyarrow_table(columns=["member_id", "title"])
    return dict(zip(table.column("member_id").to_pylist(), table.column("title").to_pylist()))


def expected_titles(bed: AirflowTestBed, pipeline: str, rules_version: str) -> dict[str, str | None]:
    """member_id -> title computed independently from the topic and the rules file."""
    from jobs.lib.rules import load_rules, rules_path
    from orchestrator.dev.datagen import expected_table, iter_log

    exp = expected_table(iter_log(bed.bootstrap, bed.topics[pipeline]), load_rules(rules_path("titles", rules_version)))
    return dict(zip(exp.table.column("member_id").to_pylist(), exp.table.column("title").to_pylist()))
