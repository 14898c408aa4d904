"""orchestrator.airflow.tasks and .params without services: attribution, retries policy, parse-time choices,
and the refusals that need no broker (unknown pipeline, unknown rules version)."""

from __future__ import annotations

import json

import pytest

from orchestrator.airflow import params, tasks
from orchestrator.core.exceptions import ConflictError, NotFoundError, RulesError
from orchestrator.core.times import utc_clock

pytestmark = pytest.mark.airflow

PIPELINES = '''
[pipelines.std_a]
job = "standardize"
topics = ["profiles_a"]
key = "member_id"
ruleset = "titles"
alias = "std_a_served"

[pipelines.views]
job = "pageviews_hourly"
topics = ["page_views"]
key = ["member_id", "window_start"]
alias = "views_served"
'''


@pytest.fixture
def kappa_env(tmp_path, monkeypatch):
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(PIPELINES)
    monkeypatch.setenv("KAPPA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KAPPA_PIPELINES", str(pipelines))
    monkeypatch.delenv("KAPPA_REGISTRY_URL", raising=False)
    monkeypatch.delenv("KAPPA_CONFIG", raising=False)
    monkeypatch.delenv("AIRFLOW_CTX_DAG_ID", raising=False)
    return tmp_path


def test_attribution():
    assert tasks.actor_for("alice") == "airflow:alice"
    assert tasks.actor_for(None) == "airflow:scheduler"
    reason = tasks.tagged_reason("  new title rules ", "kappa_reprocess", "manual__1", default="unused")
    assert reason == "new title rules [airflow kappa_reprocess run manual__1]"
    assert tasks.tagged_reason("", "kappa_promote", "r2", default="promote requested") == \
        "promote requested [airflow kappa_promote run r2]"


def test_poke_interval_has_a_floor(monkeypatch):
    monkeypatch.delenv(params.POKE_SECONDS_ENV, raising=False)
    assert params.poke_seconds() == 15.0
    monkeypatch.setenv(params.POKE_SECONDS_ENV, "0.5")
    assert params.poke_seconds() == params.MIN_POKE_SECONDS
    monkeypatch.setenv(params.POKE_SECONDS_ENV, "42")
    assert params.poke_seconds() == 42.0
    monkeypatch.setenv(params.POKE_SECONDS_ENV, "soon")
    assert params.poke_seconds() == 15.0


def test_the_form_shows_minutes_and_the_tasks_get_seconds():
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from orchestrator.lifecycle.await_ready import CATCHUP_DEADLINE_SECONDS
    from orchestrator.lifecycle.rollback import ROLLBACK_DEADLINE_SECONDS

    assert params.deadline_minutes_param(CATCHUP_DEADLINE_SECONDS, "d").value == CATCHUP_DEADLINE_SECONDS / 60 == 120
    assert params.deadline_minutes_param(ROLLBACK_DEADLINE_SECONDS, "d").value == ROLLBACK_DEADLINE_SECONDS / 60 == 30
    run = SimpleNamespace(start_date=datetime(2026, 1, 2, tzinfo=timezone.utc))
    assert params.deadline_at(run, {"catchup_deadline_minutes": 30}) == run.start_date.timestamp() + 1800.0


def test_refusals_fail_the_task_without_retry_only_inside_airflow(monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    @tasks.refusals_are_final
    def refuse():
        raise ConflictError("pipeline 'p' already has v3 in flight")

    @tasks.refusals_are_final
    def crash():
        raise RuntimeError("worker lost its connection")

    monkeypatch.delenv("AIRFLOW_CTX_DAG_ID", raising=False)
    with pytest.raises(ConflictError):
        refuse()
    monkeypatch.setenv("AIRFLOW_CTX_DAG_ID", "kappa_reprocess")
    with pytest.raises(AirflowFailException, match=r"^ConflictError: pipeline 'p' already has v3 in flight$"):
        refuse()
    with pytest.raises(RuntimeError):  # not kappa's refusal: left to the task's retries
        crash()


def test_form_choices_read_only_files(kappa_env):
    choices = params.form_choices()
    assert choices["pipelines"] == ["std_a", "views"]
    assert choices["default_pipeline"] == "std_a"
    assert choices["rules_versions"] == ["v1", "v2"]
    assert choices["rules_by_pipeline"] == {"std_a": ["v1", "v2"]}
    assert choices["rules_labels"] == {"v1": "v1 (titles)", "v2": "v2 (titles)"}
    assert not (kappa_env / "home").exists()  # no registry, no directories created


def test_validate_refuses_unknown_pipeline_and_rules(kappa_env):
    with pytest.raises(NotFoundError, match="unknown pipeline 'nope'.*std_a, views"):
        tasks.validate_reprocess("nope", user="alice", run_id="r1")
    with pytest.raises(RulesError, match="no rules file .*v9.toml.*v1, v2"):
        tasks.validate_reprocess("std_a", "v9", user="alice", run_id="r1")


def test_stop_previous_with_nothing_replaced_is_done_at_once(kappa_env):
    assert tasks.stop_previous("std_a", None, user="alice", run_id="r", dag_id="kappa_reprocess") == {"stopped": None}
    first_promote = {"version": 1, "previous_version": None, "at": 0, "grace_seconds": 300}
    assert tasks.stop_previous("std_a", first_promote, user="a", run_id="r", dag_id="d") == {"stopped": None}


def test_promote_if_asked_off_says_how(kappa_env, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="kappa.airflow"):
        assert tasks.promote_if_asked("std_a", 4, False, "why", user="alice", run_id="r") is None
    assert "kappa promote std_a 4" in caplog.text and "NOT promoted" in caplog.text
    # the configuration to paste into kappa_promote's trigger form is JSON as it stands
    conf = caplog.text.split("with this configuration JSON: ", 1)[1].split(", or run", 1)[0]
    assert json.loads(conf) == {"pipeline": "std_a", "version": 4}


def test_promote_if_asked_off_ends_skipped_in_airflow_with_the_next_step_on_the_run_note(kappa_env, monkeypatch):
    """Issue 22, item 1: inside Airflow the promote task of a run with auto-promote off ends skipped (it
    was a green success that promoted nothing), and the run's note links to kappa_promote with its JSON."""
    from airflow.sdk.exceptions import AirflowSkipException

    from orchestrator.airflow import notes

    set_notes = []
    monkeypatch.setattr(notes, "set_run_note", lambda head, body=(), **kw: set_notes.append((head, list(body))))
    monkeypatch.setenv("AIRFLOW_CTX_DAG_ID", "kappa_reprocess")
    monkeypatch.setenv(tasks.BASE_URL_ENV, "http://127.0.0.1:8080")
    with pytest.raises(AirflowSkipException, match="std_a v4 is ready and NOT promoted"):
        tasks.promote_if_asked("std_a", 4, False, "why", user="alice", run_id="r", report=REPORT)
    [(head, body)] = set_notes
    assert head.startswith("std_a v4 is ready and NOT promoted")
    text = "\n".join(body)
    assert "[open kappa_promote](http://127.0.0.1:8080/dags/kappa_promote)" in text
    assert json.loads(text.split("```json\n", 1)[1].split("\n```", 1)[0]) == {"pipeline": "std_a", "version": 4}
    assert "| 812 | Sr. Engineer | Senior Engineer |" in text   # the report rides along


REPORT = {"pipeline": "std_a", "version": 4, "serving_version": 3, "rules_version": "v2", "keys_new": 4998,
          "keys_serving": 5000, "key_delta_ratio": -0.0004, "key_count_ok": True, "rejects": 21,
          "offsets_read": 3120, "reject_rate": 0.0067, "max_reject_rate": 0.01, "reject_rate_ok": True,
          "rows_compared": 4990, "rows_same_input": 4990, "rows_changed": 812,
          "changed_by_column": {"title": 812, "company": 0},
          "top_changes": {"title": [{"old": "Sr. Engineer", "new": "Senior Engineer", "count": 812}]},
          "checks": [], "problems": []}



def _versions(n: int) -> None:
    """Versions 1..n of std_a in the registry: the tasks resolve the version they act on first."""
    from orchestrator.context import Kappa

    with Kappa() as k:
        for _ in range(n):
            k.registry.allocate_version("std_a", rules_version="v1", rules_hash=None, code_ref="test",
                                        paths=lambda m: k.paths("std_a", m), actor="t", reason="r", queue=True)

def test_the_report_task_logs_whole_lines_and_its_note_sums_up_and_links_to_it(kappa_env, monkeypatch, caplog):
    """Issue 30, items 5-7: the log broke sentences mid-line ("(input skew, not / counted)") and printed the keys
    only one version holds twice; the note said "4,846 keys (v1: 4,875, 0.00 % off)" without the 29 keys left
    out; the run page showed only a clamped first line. Now: one log line per sentence (never hard-wrapped), the
    key count with what it compared and left out, and a first line that sums the report up and links to it."""
    import logging

    from orchestrator.airflow import notes
    from orchestrator.lifecycle import report as report_mod

    skewed = {**REPORT, "keys_new": 4846, "keys_serving": 4875, "keys_only_serving": 29, "keys_only_serving_skewed": 29,
              "keys_new_compared": 4846, "keys_serving_compared": 4846, "key_delta_ratio": 0.0,
              "top_changes": {"title": [{"old": "x" * 150, "new": "Senior Engineer", "count": 3}]}}
    skewed["keys_compared"] = report_mod.Report.model_construct(**skewed).keys_compared   # as its JSON dump has it

    class Rep:
        problems: list = []

        def model_dump(self, mode):
            return skewed

    set_notes = []
    monkeypatch.setenv(tasks.BASE_URL_ENV, "http://127.0.0.1:8080")
    monkeypatch.setattr(report_mod, "validation_report", lambda v: Rep())
    _versions(4)
    monkeypatch.setattr(notes, "set_run_note", lambda head, body=(), **kw: set_notes.append((head, list(body))))
    with caplog.at_level(logging.INFO, logger="kappa.airflow"):
        tasks.report("std_a", 4, dag_id="kappa_reprocess", run_id="manual__1")
    lines = [r.getMessage() for r in caplog.records]
    assert "validation report: std_a v4 (rules v2) against serving v3 (rules -)" in lines
    keys = ("  keys: 4,846 keys in v4, 4,875 in v3; compared 4,846 with 4,846, leaving out 29 only in v3 on partitions "
            "read to different offsets (input skew): difference 0.00%, tolerance 0.00% ok")
    assert keys in lines, lines
    assert [line for line in lines if "only in v" in line and "keys" in line and "compared" not in line] == [
        "  keys only in v4: 0, only in v3: 29 (0 and 29 of them input skew, left out of the key count)"]
    assert any(("x" * 150) in line and "Senior Engineer" in line for line in lines)   # a table row stays one line
    assert not any('{"old"' in line for line in lines)
    [(head, body)] = set_notes
    assert head == ("std_a v4 has caught up; its checks pass · [full report](/dags/kappa_reprocess/"
                    "runs/manual__1/tasks/validation_report): 4,846 keys in v4, 4,875 in v3; compared 4,846 with 4,846, "
                    "leaving out 29 only in v3 on partitions read to different offsets (input skew): 0.00 % off, ok; 812 "
                    "rows changed; 21 rejects (0.67 %, ok)")
    assert "| 3 | " + "x" * 39 + "… | Senior Engineer |" in body


def test_an_auto_promote_refused_because_the_version_fell_behind_waits_and_promotes(kappa_env, monkeypatch):
    """The demo's CI failure, in the reprocess DAG: the sensor saw the version ready, the promote's own
    check a moment later saw lag 1010 over 1000. The task waits until it is ready again and promotes;
    a refusal for anything else (key count) fails at once."""
    from orchestrator.core.exceptions import NotReadyError
    from orchestrator.lifecycle import await_ready

    outcomes = [NotReadyError("ready: lag 1010 > threshold 1000", failed_checks=["ready"]), {"flipped": True}]
    calls, waits = [], []

    def verb(pipeline, version, reason, **kw):
        calls.append(version)
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out

    def wrapper(*a, **kw):
        raise AssertionError("the task calls the verb under its own refusal policy")
    wrapper.__wrapped__ = verb
    monkeypatch.setattr(tasks, "promote", wrapper)
    monkeypatch.setattr(await_ready, "wait_ready", lambda v, **kw: waits.append((v.pipeline, v.version,
                                                                                kw["deadline_seconds"])))
    _versions(4)
    assert tasks.promote_if_asked("std_a", 4, True, "why", user="alice", run_id="r") == {"flipped": True}
    assert calls == [4, 4] and waits == [("std_a", 4, tasks.READY_AGAIN_SECONDS)]

    outcomes[:] = [NotReadyError("key_count: 1 keys vs 3", failed_checks=["key_count"])]
    with pytest.raises(NotReadyError, match="key_count"):
        tasks.promote_if_asked("std_a", 4, True, "why", user="alice", run_id="r")
    assert len(waits) == 1

@pytest.mark.parametrize("after, done", [(299.5, False), (300.0, True), (300.5, True)])
def test_stop_previous_stops_only_a_standby_whose_grace_period_is_over(kappa_env, monkeypatch, after, done):
    """Issue 22, item 4: within the grace period the task no longer waits it out (the promote run stayed Running
    for 5 minutes): it ends skipped saying until when v1 stays a standby, and kappa_monitor stops it then.
    Past it (grace 0, or a retry), it stops the standby at once. The grace period is in seconds."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowSkipException

    from orchestrator.context import Kappa

    from orchestrator.lifecycle.monitor import standby_until

    monkeypatch.setenv("AIRFLOW_CTX_DAG_ID", "kappa_promote")
    with Kappa() as k:
        for _ in range(2):
            k.registry.allocate_version("std_a", rules_version="v1", rules_hash=None, code_ref="test",
                                        paths=lambda n: k.paths("std_a", n), actor="t", reason="r", queue=True)
        k.registry.flip_alias("std_a_served", "std_a", expected_version=None, new_version=1, actor="t", reason="r")
        k.registry.flip_alias("std_a_served", "std_a", expected_version=1, new_version=2, actor="t", reason="r",
                              standby_grace_seconds=300)
        k.registry.set_state("std_a", 2, "serving")
        k.registry.set_state("std_a", 1, "standby")
        until = standby_until(k.version("std_a", 1))
    promoted_at = until - 300
    monkeypatch.setattr(tasks, "time", SimpleNamespace(time=lambda: promoted_at + after))
    promoted = {"version": 2, "previous_version": 1, "at": promoted_at, "grace_seconds": 300}
    if not done:
        with pytest.raises(AirflowSkipException) as e:
            tasks.stop_previous("std_a", promoted, user="alice", run_id="r7", dag_id="kappa_promote")
        clock = utc_clock(until, date="never")
        assert str(e.value).startswith(f"v1 stays a running standby until {clock} (grace period 300 s): "
                                       "kappa_rollback flips back to it at once until then; kappa_monitor stops it")
    else:
        res = tasks.stop_previous("std_a", promoted, user="alice", run_id="r7", dag_id="kappa_promote")
        assert res["stopped"] == 1 and (res["how"], res["version"]) == ("not-running", 1)
    with Kappa() as k:
        state = k.registry.get_version("std_a", 1).state
        stops = [(e.actor, e.reason) for e in k.registry.audit_log("std_a", action="stop")]
    if not done:
        assert (state, stops) == ("standby", [])
    else:
        assert state == "stopped"
        assert stops == [("airflow:alice", "standby grace period of 300 s after promoting v2 is over "
                                            "[airflow kappa_promote run r7]")]


def test_a_restarting_rollback_heads_its_note_with_lag_and_eta_at_every_poke(kappa_env, monkeypatch):
    """Issue 22, item 5: the rollback's wait showed progress only in the sensor's log."""
    from types import SimpleNamespace

    from orchestrator.airflow import notes

    set_notes = []
    monkeypatch.setattr(notes, "set_run_note", lambda head, body=(), **kw: set_notes.append((head, list(body))))

    def one_poke(pipeline, version, *, deadline_at, user, on_sample):
        on_sample(SimpleNamespace(total_lag=None, eta_seconds=None, job_health="starting", at=1_700_000_000.0))
        on_sample(SimpleNamespace(total_lag=312, eta_seconds=8.0, job_health="running", at=1_700_000_000.0))
        return {"is_done": False, "xcom_value": None}
    monkeypatch.setattr(tasks, "poke_ready", one_poke)
    message = "std_a v1 was stopped at 22:13:20 UTC by cron: restarting it from its checkpoint, 312 records to catch up"
    prepared = {"pipeline": "std_a", "to_version": 1, "done": False, "restarted": True, "message": message}
    assert tasks.poke_rollback_ready(prepared, deadline_at=0, user="bob") == {"is_done": False, "xcom_value": None}
    assert [h for h, _ in set_notes] == ["rolling back std_a to v1, restarting v1: job starting...",
                                         f"rolling back std_a to v1, restarting v1: lag 312 records, ETA 8 s "
                                         f"({utc_clock(1_700_000_008.0, date='never')})"]
    assert all(body == [message] for _, body in set_notes)
