"""Promote, rollback, reconcile: preconditions with exact errors, CAS races, interrupted flips."""

from __future__ import annotations

import json
import re
from pathlib import Path
import threading

import pytest

from orchestrator.core import crashpoints

from control_helpers import ALIAS, PIPELINE, allocate, commit_batch, fake_running, profiles, ready_version, write_table
from orchestrator.lifecycle import promote as promote_mod
from orchestrator.core.exceptions import ConfigError, ConflictError, LifecycleError, NotFoundError, NotReadyError
from orchestrator.lifecycle.promote import promote, promote_target
from orchestrator.lifecycle.reconcile import reconcile
from orchestrator.lifecycle.rollback import finish_rollback, prepare_rollback, rollback
from orchestrator.serving import read_pointer, resolve_alias

ROWS_V1 = [("m1", "swe", "SWE", "Ada", 1), ("m2", "sr swe", "Sr SWE", "Alan", 2), ("m3", "pm", "PM", "Grace", 3)]
ROWS_V2 = [("m1", "swe", "Software Engineer", "Ada", 1), ("m2", "sr swe", "Senior Software Engineer", "Alan", 2),
           ("m3", "pm", "PM", "Grace", 3)]


def test_first_promote_needs_no_key_comparison_and_publishes(k, fake_log):
    v = ready_version(k, fake_log, ROWS_V1)
    res = promote(k.version(PIPELINE, v), actor="alice", reason="first")
    assert res.flipped and res.published and res.previous_version is None
    assert {c.name: c.ok for c in res.checks} == {"ready": True, "key_count": True, "reject_rate": True}
    assert "first promote" in [c for c in res.checks if c.name == "key_count"][0].detail
    assert resolve_alias(ALIAS, k.settings)["version"] == v
    assert k.registry.get_version(PIPELINE, v).state == "serving"
    (entry,) = k.registry.audit_log(PIPELINE, action="promote")
    assert (entry.actor, entry.reason, entry.outcome) == ("alice", "first", "ok")
    assert entry.details["from_version"] is None and entry.details["to_version"] == v
    assert [s["total"] for s in entry.details["readiness"]["samples"]] == [0, 0, 0]
    assert entry.details["readiness"]["rule"].startswith("lag <= 0 records and <= 60 s behind in 3 samples")


def test_second_promote_reports_the_rules_changes_and_keeps_a_standby(k, fake_log):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    res = promote(k.version(PIPELINE, v2), actor="bob", reason="new rules")
    assert res.previous_version == v1
    assert res.report.rows_changed == 2 and res.report.keys_new == res.report.keys_serving == 3
    assert res.report.top_changes["title"] == [
        {"old": "SWE", "new": "Software Engineer", "count": 1},
        {"old": "Sr SWE", "new": "Senior Software Engineer", "count": 1}]
    assert k.paths(PIPELINE, v2).report_file.exists()
    assert k.registry.get_version(PIPELINE, v1).state == "standby"
    assert "standby_since" in k.registry.get_version(PIPELINE, v1).details
    assert resolve_alias(ALIAS, k.settings)["version"] == v2


def test_without_a_version_promote_serves_the_newest_caught_up_one(k, fake_log):
    with pytest.raises(NotFoundError) as e:
        promote(k.version(PIPELINE, promote_target(k, PIPELINE)), actor="alice", reason="nothing yet")
    assert str(e.value) == (f"{PIPELINE} has no caught-up version to promote (versions: none); name the version "
                            f"to promote, or deploy one and wait until it is caught up")
    v1 = ready_version(k, fake_log, ROWS_V1)
    v2 = ready_version(k, fake_log, ROWS_V2)
    lagging = allocate(k).version  # newer, but not caught up: not a promote target
    k.registry.set_state(PIPELINE, lagging, "backfilling")
    assert promote_target(k, PIPELINE) == v2
    res = promote(k.version(PIPELINE, promote_target(k, PIPELINE)), actor="alice", reason="newest ready")
    assert res.flipped and res.version == v2
    assert promote_target(k, PIPELINE) == v1  # v2 serves now: no longer caught_up
    k.registry.set_state(PIPELINE, v1, "stopped")
    with pytest.raises(NotFoundError, match=rf"versions: v{v1} stopped, v{v2} serving, v{lagging} backfilling\)"):
        promote_target(k, PIPELINE)


def test_promote_refused_while_lagging_with_the_exact_error_and_nothing_changed(k, fake_log):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v)
    write_table(k.paths(PIPELINE, v).table, profiles(ROWS_V1))
    with pytest.raises(NotReadyError) as e:
        promote(k.version(PIPELINE, v), actor="alice", reason="too early")
    assert str(e.value) == (f"cannot promote {PIPELINE} v{v} to alias '{ALIAS}': ready: {PIPELINE} v{v}: "
                            f"hydrating, lag 150, 2 s behind, 0/3 samples with lag <= 0 records and <= 60 s behind; "
                            f"lag 150 > threshold 0 records")
    assert e.value.failed_checks == ("ready",)
    assert k.registry.get_alias(ALIAS) is None
    assert read_pointer(k.alias_file(ALIAS)) is None
    assert k.registry.audit_log(PIPELINE, action="promote")[-1].outcome == "refused"


def test_the_demo_waits_again_when_a_ready_version_falls_behind_before_its_promote(k, fake_log, monkeypatch):
    """CI's `kappa demo` failed here: v2 was ready (lag 976, threshold 1000), live updates pushed the
    lag to 1010 before the promote's own check, and the demo gave up. The demo must wait until the
    version has caught up again, then promote; any other refusal still ends it."""
    import io

    from rich.console import Console

    from orchestrator.dev import demo as demo_mod
    from orchestrator.lifecycle import await_ready

    v = ready_version(k, fake_log, ROWS_V1)
    k.registry.add_lag_sample(PIPELINE, v, 0, {}, lag_seconds=0.0, batches=3)   # ready: three samples at lag 0
    fake_log.ends = {tp: end + 5 for tp, end in fake_log.ends.items()}   # live updates arrive before the flip
    real_wait, waits = await_ready.wait_ready, []

    def job_catches_up_then_wait(*args, **kwargs):
        waits.append(k.registry.get_alias(ALIAS))
        fake_log.read_all()                               # the job's next micro-batches commit
        return real_wait(*args, **{**kwargs, "poll_seconds": 0.01,
                                   "on_sample": lambda r: commit_batch(k, v)})

    monkeypatch.setattr(await_ready, "wait_ready", job_catches_up_then_wait)
    out = io.StringIO()
    d = demo_mod.Demo(demo_mod.DemoOptions(deadline=30, poll=0.01), Console(file=out, width=300))
    d.k, d.alias, d.pipeline = k, ALIAS, PIPELINE
    d.promote(v, "demo")
    assert waits == [None]                                # refused once, waited once, then flipped
    assert resolve_alias(ALIAS, k.settings)["version"] == v
    text = out.getvalue()
    assert f"the promote was refused: v{v} fell behind again since it was ready" in text
    assert "lag 10 > threshold 0 records); waiting until it has caught up again" in text
    assert [e.outcome for e in k.registry.audit_log(PIPELINE, action="promote")] == ["refused", "ok"]

    v2 = ready_version(k, fake_log, ROWS_V1[:1])           # 1 key against 3: over the 10% tolerance
    with pytest.raises(NotReadyError) as e:             # a key-count refusal is not waited out
        d.promote(v2, "demo")
    assert e.value.failed_checks == ("key_count",)
    assert waits == [None]


def test_promote_refused_when_the_job_failed(k, fake_log):
    v = ready_version(k, fake_log, ROWS_V1)
    fake_running(k, v, state="failed", error="SinkError: disk full")
    with pytest.raises(NotReadyError) as e:
        promote(k.version(PIPELINE, v), actor="alice", reason="r")
    assert str(e.value) == (f"cannot promote {PIPELINE} v{v} to alias '{ALIAS}': ready: {PIPELINE} v{v}: failing, "
                            f"lag 0, 0 s behind, ETA 0 s, 3/3 samples with lag <= 0 records and <= 60 s behind; the job "
                            f"reported failure: SinkError: disk full")


def test_promote_refused_when_lag_is_unknown(k, fake_log):
    v = ready_version(k, fake_log, ROWS_V1)
    fake_log.down = True
    with pytest.raises(NotReadyError) as e:
        promote(k.version(PIPELINE, v), actor="alice", reason="r")
    assert str(e.value) == (
        f"cannot promote {PIPELINE} v{v} to alias '{ALIAS}': ready: {PIPELINE} v{v}: lagging, lag unknown, "
        f"unknown behind, 0/3 samples with lag <= 0 records and <= 60 s behind; lag unknown (cannot read log end "
        f"offsets from the Kafka broker at 127.0.0.1:9 (KafkaError{{code=_TRANSPORT}})); unknown lag never counts as "
        f"caught up")


def test_promote_refused_on_key_count_and_reject_rate(k, fake_log):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V1[:1])
    write_table(k.paths(PIPELINE, v2).rejects, profiles(ROWS_V1 * 4))  # 12 rejects of 150 records read
    with pytest.raises(NotReadyError) as e:
        promote(k.version(PIPELINE, v2), actor="alice", reason="r")
    assert str(e.value) == (
        f"cannot promote {PIPELINE} v{v2} to alias '{ALIAS}': key_count: 1 keys in v{v2}, 3 in v{v1}; all compared: "
        f"difference 66.67%, over the tolerance 10.00% (key_count_tolerance); reject_rate: 12 rejects "
        f"of 150 records read (8.00%, limit 5.00%)")
    assert k.registry.get_alias(ALIAS).version == v1


def test_dry_run_says_what_would_happen_and_changes_nothing(k, fake_log):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    samples_before = len(k.registry.lag_samples(PIPELINE, v2))
    audit_before = len(k.registry.audit_log(None, limit=None))
    res = promote(k.version(PIPELINE, v2), actor="bob", reason="try", dry_run=True)
    assert res.dry_run and res.would_succeed and not res.flipped
    assert res.actions == [
        f"write the validation report to {k.paths(PIPELINE, v2).report_file}",
        f"flip alias '{ALIAS}' from v{v1} to v{v2} (compare-and-swap in the registry)",
        f"publish pointer {k.alias_file(ALIAS)} -> {k.paths(PIPELINE, v2).table}",
        f"set {PIPELINE} v{v2} to serving",
        f"keep v{v1} running as standby for 60 s, then stop its job (table and checkpoint kept)",
        "record the promote by 'bob': try"]
    assert k.registry.get_alias(ALIAS).version == v1
    assert len(k.registry.lag_samples(PIPELINE, v2)) == samples_before
    assert len(k.registry.audit_log(None, limit=None)) == audit_before
    assert not k.paths(PIPELINE, v2).report_file.exists()
    fake_log.down = True
    refused = promote(k.version(PIPELINE, v2), actor="bob", reason="try", dry_run=True)
    assert not refused.would_succeed and refused.error.startswith(f"cannot promote {PIPELINE} v{v2}")
    assert refused.message == f"dry run: would refuse. {refused.error}"


def test_concurrent_promotes_exactly_one_wins(k, fake_log, monkeypatch):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2, v3 = ready_version(k, fake_log, ROWS_V2), ready_version(k, fake_log, ROWS_V2)
    barrier = threading.Barrier(2, timeout=30)
    real_flip = k.registry.flip_alias

    def flip_after_both_checked(*a, **kw):
        barrier.wait()  # both promotes have passed every check before either swaps
        return real_flip(*a, **kw)

    monkeypatch.setattr(k.registry, "flip_alias", flip_after_both_checked)
    outcomes: dict[int, object] = {}

    def run(v):
        try:
            outcomes[v] = promote(k.version(PIPELINE, v), actor=f"op{v}", reason="race")
        except Exception as e:
            outcomes[v] = e

    threads = [threading.Thread(target=run, args=(v,)) for v in (v2, v3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wins = [v for v, o in outcomes.items() if not isinstance(o, Exception)]
    losses = [o for o in outcomes.values() if isinstance(o, Exception)]
    assert len(wins) == 1 and len(losses) == 1
    assert isinstance(losses[0], ConflictError)
    loser = ({v2, v3} - set(wins)).pop()
    assert str(losses[0]).startswith(f"promote of {PIPELINE} v{loser} lost the race: alias '{ALIAS}' no longer "
                                     f"points at v{v1} (it points at v{wins[0]} now")
    assert k.registry.get_alias(ALIAS).version == wins[0]
    assert resolve_alias(ALIAS, k.settings)["version"] == wins[0]
    assert k.registry.get_version(PIPELINE, loser).state == "caught_up"


def _crash_after_cas(monkeypatch):
    def crash(k, alias):
        raise KeyboardInterrupt("the orchestrator died between the CAS and the publish")

    monkeypatch.setattr(promote_mod, "publish_current", crash)


def test_crash_between_cas_and_publish_then_reconcile(k, fake_log, monkeypatch):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    with monkeypatch.context() as m:
        _crash_after_cas(m)
        with pytest.raises(KeyboardInterrupt):
            promote(k.version(PIPELINE, v2), actor="bob", reason="crash")
    alias = k.registry.get_alias(ALIAS)
    assert (alias.version, alias.published_version) == (v2, v1)
    assert resolve_alias(ALIAS, k.settings)["version"] == v1  # readers still on v1, consistently
    actions = reconcile(k, actor="cron")
    assert [(a["kind"], a["version"], a["pointer_was"]) for a in actions] == [("publish", v2, v1)]
    assert resolve_alias(ALIAS, k.settings)["version"] == v2
    assert k.registry.get_alias(ALIAS).published_version == v2
    assert (k.registry.get_version(PIPELINE, v2).state, k.registry.get_version(PIPELINE, v1).state) == \
        ("serving", "standby")
    assert reconcile(k, actor="cron") == []


def test_rerunning_promote_after_the_crash_finishes_the_publish(k, fake_log, monkeypatch):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    with monkeypatch.context() as m:
        _crash_after_cas(m)
        with pytest.raises(KeyboardInterrupt):
            promote(k.version(PIPELINE, v2), actor="bob", reason="crash")
    res = promote(k.version(PIPELINE, v2), actor="bob", reason="again")
    assert not res.flipped and res.message == f"{PIPELINE} v{v2} already serves alias '{ALIAS}'; nothing to promote"
    assert resolve_alias(ALIAS, k.settings)["version"] == v2


def test_rerunning_rollback_after_the_crash_does_not_flip_back(k, fake_log):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    promote(k.version(PIPELINE, v2), actor="alice", reason="second")
    with crashpoints.armed_at("rollback.flipped"), pytest.raises(crashpoints.KappaCrashed):
        rollback(k, k.pipeline(PIPELINE), actor="alice", reason="bad v2", poll_seconds=0.01, deadline_seconds=10)
    res = rollback(k, k.pipeline(PIPELINE), actor="alice", reason="bad v2 (again)", poll_seconds=0.01)
    assert not res.flipped and "finished the interrupted flip" in res.message
    assert k.registry.get_alias(ALIAS).version == v1
    assert resolve_alias(ALIAS, k.settings)["version"] == v1


def test_rollback_after_a_promote_cut_off_before_its_publish_rolls_back(k, fake_log):
    """Issue 9 case 9: `kappa rollback` finished the interrupted promote instead of rolling back."""
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    with crashpoints.armed_at("promote.flipped"), pytest.raises(crashpoints.KappaCrashed):
        promote(k.version(PIPELINE, v2), actor="bob", reason="crash")
    assert resolve_alias(ALIAS, k.settings)["version"] == v1
    res = rollback(k, k.pipeline(PIPELINE), actor="alice", reason="v2 is bad", poll_seconds=0.01, deadline_seconds=10)
    assert res.flipped and (res.from_version, res.to_version) == (v2, v1)
    assert k.registry.get_alias(ALIAS).version == v1
    assert resolve_alias(ALIAS, k.settings)["version"] == v1
    assert [k.registry.get_version(PIPELINE, v).state for v in (v1, v2)] == ["serving", "standby"]


def test_rollback_to_a_running_standby_is_a_flip(k, fake_log):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    promote(k.version(PIPELINE, v2), actor="alice", reason="second")
    res = rollback(k, k.pipeline(PIPELINE), actor="alice", reason="bad v2", poll_seconds=0.01)
    assert (res.from_version, res.to_version, res.flipped, res.restarted) == (v2, v1, True, False)
    assert resolve_alias(ALIAS, k.settings)["version"] == v1
    assert k.registry.get_version(PIPELINE, v2).state == "standby"
    assert k.registry.get_alias(ALIAS).previous_version == v2
    fwd = rollback(k, k.pipeline(PIPELINE), actor="alice", reason="forward again", poll_seconds=0.01)
    assert fwd.to_version == v2 and resolve_alias(ALIAS, k.settings)["version"] == v2


def test_rollback_in_two_halves_as_the_dag_runs_it(k, fake_log):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    promote(k.version(PIPELINE, v2), actor="alice", reason="second")
    plan = prepare_rollback(k, k.pipeline(PIPELINE), actor="airflow:alice", reason="bad v2")
    until = k.registry.get_version(PIPELINE, v1).details["standby_until"]
    assert re.fullmatch(rf"{PIPELINE} v{v1} still runs as a standby: the flip is instant \(until "
                        r"[0-9: -]+ UTC, when its grace period ends\)", plan.message), plan.message
    assert plan.model_dump(mode="json", exclude={"message"}) == {
        "pipeline": PIPELINE, "alias": ALIAS, "from_version": v2, "to_version": v1, "restarted": False,
        "done": False, "pointer": None,
        "estimate": {"version": v1, "restart": False, "records_behind": None, "lag_error": None, "stopped_at": None,
                     "stopped_by": None, "stop_reason": None, "last_restart_seconds": None, "standby_until": until},
        "restarted_at": None}
    assert k.registry.get_alias(ALIAS).version == v2  # the first half flips nothing
    res = finish_rollback(k, plan, actor="airflow:alice", reason="bad v2", poll_seconds=0.01)
    assert (res.from_version, res.to_version, res.flipped) == (v2, v1, True)
    assert resolve_alias(ALIAS, k.settings)["version"] == v1
    again = prepare_rollback(k, k.pipeline(PIPELINE), v1, actor="airflow:alice", reason="again")
    assert again.done and again.message == f"{PIPELINE} v{v1} already serves alias '{ALIAS}'; nothing to roll back"
    assert not finish_rollback(k, again, actor="airflow:alice").flipped
    assert k.registry.get_alias(ALIAS).version == v1


def test_rollback_restarts_a_stopped_version_from_its_checkpoint(k, fake_log, fake_jobs):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    promote(k.version(PIPELINE, v2), actor="alice", reason="second")
    k.paths(PIPELINE, v1).launch_file.unlink()
    k.paths(PIPELINE, v1).status_file.unlink()          # v1's job is gone (stopped after its grace)
    k.registry.set_state(PIPELINE, v1, "stopped")
    Path(k.paths(PIPELINE, v1).checkpoint).mkdir(parents=True)
    res = rollback(k, k.pipeline(PIPELINE), actor="alice", reason="bad v2", poll_seconds=0.05, deadline_seconds=30)
    assert res.restarted and res.flipped and res.to_version == v1
    starts = k.registry.audit_log(PIPELINE, action="start", version=v1)
    assert starts[-1].details["resumed"] is True
    assert resolve_alias(ALIAS, k.settings)["version"] == v1


def test_rollback_never_restarts_from_zero(k, fake_log):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    promote(k.version(PIPELINE, v2), actor="alice", reason="second")
    k.paths(PIPELINE, v1).launch_file.unlink()
    k.paths(PIPELINE, v1).status_file.unlink()
    with pytest.raises(LifecycleError, match=rf"cannot roll back to {PIPELINE} v{v1}: its checkpoint .* is missing, "
                                             r"and a rollback never re-reads from offset zero"):
        rollback(k, k.pipeline(PIPELINE), actor="alice", reason="r")
    assert k.registry.get_alias(ALIAS).version == v2


def test_rollback_with_nothing_to_roll_back_to(k, fake_log):
    with pytest.raises(NotFoundError, match="serves nothing yet"):
        rollback(k, k.pipeline(PIPELINE), actor="alice", reason="r")
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    with pytest.raises(NotFoundError, match="has no previous version to roll back to"):
        rollback(k, k.pipeline(PIPELINE), actor="alice", reason="r")


@pytest.mark.parametrize("which, removal", [("candidate", "data files"), ("serving", "whole folder")])
def test_promote_of_a_version_whose_table_a_retire_deletes_meanwhile_is_refused(k, fake_log, monkeypatch,
                                                                                 which, removal):
    """The stress test's failures: a concurrent retire deleted a table's data files (or its whole folder,
    Delta log included) between the report's read of its log and its read of the data; promote raised
    delta-rs's FileNotFoundError (or an AttributeError on a table that was None) instead of refusing.
    The report reads each table once (`orchestrator.core.tables.snapshot`): the deletion lands
    between that read's open and its scan."""
    import shutil

    from orchestrator.core import tables as tables_mod

    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    table = Path(k.paths(PIPELINE, v2 if which == "candidate" else v1).table)
    real_read = tables_mod.read_table
    hit = []

    def read_after_the_retire(dt, columns=None, predicate=None):
        if Path(dt.table_uri.removeprefix("file://")).resolve() == table.resolve() and not hit:
            hit.append(dt.version())
            if removal == "data files":
                for f in table.glob("*.parquet"):
                    f.unlink()
            else:
                shutil.rmtree(table)
        return real_read(dt, columns, predicate)

    monkeypatch.setattr(tables_mod, "read_table", read_after_the_retire)
    with pytest.raises(NotReadyError, match=r"report: cannot read the table .*retired or deleted meanwhile"):
        promote(k.version(PIPELINE, v2), actor="bob", reason="new rules")
    assert hit, "the deletion landed between the table's log read and its data read"
    assert resolve_alias(ALIAS, k.settings)["version"] == v1
    assert k.registry.get_version(PIPELINE, v2).state == "caught_up"


@pytest.mark.parametrize("when", ["before_the_write", "at_the_rename"])
def test_promote_of_a_version_whose_folder_a_retire_deletes_while_the_report_is_written_is_refused(
        k, fake_log, monkeypatch, when):
    """The stress test's second failure: the retire deleted v1's folder while the report was being
    written; promote raised FileNotFoundError from the rename. Deleted just before the write, the
    old write made the folder again: a stray report of a retired version."""
    import os
    import shutil
    import types

    from orchestrator.core import files as files_mod
    from orchestrator.lifecycle import report as report_mod

    v1 = ready_version(k, fake_log, ROWS_V1)
    folder = Path(k.paths(PIPELINE, v1).report_file).parent
    if when == "before_the_write":
        real_write = report_mod.write_json_atomic

        def retired_then_write(path, obj, **kw):
            shutil.rmtree(folder)
            return real_write(path, obj, **kw)

        monkeypatch.setattr(report_mod, "write_json_atomic", retired_then_write)
    else:
        def retired_then_replace(src, dst):
            shutil.rmtree(folder)
            return os.replace(src, dst)

        monkeypatch.setattr(files_mod, "os", types.SimpleNamespace(**{**vars(os), "replace": retired_then_replace}))
    with pytest.raises(NotReadyError, match=r"report: cannot write the validation report .*retired meanwhile"):
        promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    assert not folder.exists()
    assert k.registry.get_alias(ALIAS) is None


def test_a_promotes_own_grace_period_is_said_and_stored_with_its_flip_and_its_watch(k, fake_log, monkeypatch):
    """`grace_seconds` (the kappa_promote form's override): the texts, the watch and the standby's end
    all use it, from the same flip; the pipeline's grace period (60 s) is not used."""
    from control_helpers import Clock, make_spec
    from orchestrator.context import Kappa
    from orchestrator.lifecycle import watch as watch_mod
    kk = Kappa(k.settings, registry=k.registry, pipelines={PIPELINE: make_spec(auto_rollback=True)})
    v1 = ready_version(kk, fake_log, ROWS_V1)
    promote(kk.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(kk, fake_log, ROWS_V2)
    dry = promote(kk.version(PIPELINE, v2), actor="bob", reason="new rules", dry_run=True, grace_seconds=5)
    assert [a for a in dry.actions if "5 s" in a] == [
        f"keep v{v1} running as standby for 5 s, then stop its job (table and checkpoint kept)",
        f"watch v{v2} for 5 s (auto_rollback): roll back to v{v1} if it degrades"]
    res = promote(kk.version(PIPELINE, v2), actor="bob", reason="new rules", grace_seconds=5)
    assert res.message.endswith(f"; v{v1} is standby for 5 s, while v{v2} is watched (auto_rollback)")
    standby = kk.registry.get_version(PIPELINE, v1).details
    w = kk.registry.get_version(PIPELINE, v2).details["watch"]
    assert standby["standby_until"] == standby["standby_since"] + 5
    assert w["until"] == w["started_at"] + 5 <= standby["standby_until"]   # the watch ends first
    Clock(w["until"]).install(monkeypatch, watch_mod)
    assert [a["kind"] for a in watch_mod.watch_pass(kk, kk.pipeline(PIPELINE))] == ["passed"]
    (passed,) = kk.registry.audit_log(PIPELINE, action="watch")
    assert passed.reason == f"v{v2} healthy through its grace period of 5 s"


@pytest.mark.parametrize("grace", [-1, float("nan"), float("inf")])
def test_a_grace_period_below_zero_or_not_finite_is_refused_and_nothing_changes(k, fake_log, grace):
    v1 = ready_version(k, fake_log, ROWS_V1)
    with pytest.raises(ConfigError, match=rf"promote of {PIPELINE}: the standby grace period must be 0 or more "
                                          rf"seconds, not {grace!r} \(--grace; empty for the pipeline's 60 s\)"):
        promote(k.version(PIPELINE, v1), actor="alice", reason="first", grace_seconds=grace)
    assert k.registry.get_alias(ALIAS) is None and k.registry.audit_log(PIPELINE, action="promote") == []


def test_the_version_a_rollback_leaves_is_a_standby_for_the_pipelines_grace_period(k, fake_log):
    """A rollback knows no promote's grace: the version it flips away from stays a standby for the
    pipeline's (60 s); the one it serves again no longer carries its standby times."""
    from orchestrator.lifecycle.monitor import standby_until
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    promote(k.version(PIPELINE, v2), actor="alice", reason="second", grace_seconds=5)
    assert standby_until(k.version(PIPELINE, v1)) == k.registry.get_version(PIPELINE, v1).details["standby_since"] + 5
    rollback(k, k.pipeline(PIPELINE), actor="alice", reason="bad v2", poll_seconds=0.01)
    back, left = k.registry.get_version(PIPELINE, v1), k.registry.get_version(PIPELINE, v2)
    assert back.state == "serving" and not {"standby_since", "standby_until"} & set(back.details)
    assert left.state == "standby" and left.details["standby_until"] == left.details["standby_since"] + 60
    assert (standby_until(k.version(PIPELINE, v1)), standby_until(k.version(PIPELINE, v2))) == (None, left.details["standby_until"])


def test_kappa_promote_grace_is_the_promotes_own_grace_period(k, fake_log, tmp_path, monkeypatch):
    from typer.testing import CliRunner
    from orchestrator.cli import app
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(f'[pipelines.{PIPELINE}]\njob = "standardize"\ntopics = ["orders"]\nkey = "member_id"\n'
                         f'alias = "{ALIAS}"\ncatchup_threshold = 0\ncatchup_samples = 3\n'
                         f'grace_period_seconds = 60\nkey_count_tolerance = 0.1\nmax_reject_rate = 0.05\n')
    base = ["--home", str(k.settings.home), "--registry-url", k.registry.url, "--pipelines-file", str(pipelines),
            "--bootstrap-servers", "127.0.0.1:9", "promote", PIPELINE, str(v2), "--reason", "r", "--actor", "bob"]
    out = CliRunner().invoke(app, [*base, "--grace", "5", "--dry-run", "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert f"keep v{v1} running as standby for 5 s, then stop its job (table and checkpoint kept)" in \
        json.loads(out.stdout)["actions"]
    out = CliRunner().invoke(app, [*base, "--grace", "-1"])
    assert out.exit_code == 2 and k.registry.get_alias(ALIAS).version == v1
