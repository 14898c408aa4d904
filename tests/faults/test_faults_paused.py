"""Fault suite (issue 33), scenario 5: the serving version's job paused (SIGSTOP of its whole process
group: the Python driver, the JVM, the Python workers) with a live micro-batch in flight, for longer
than the supervisor's heartbeat bound, then resumed (SIGCONT) while the supervisor stops it.

The interleaving is forced, not waited for by luck: the live batch is held before its commits
(`KAPPA_TEST_HOLD_BEFORE_COMMIT`), the group is stopped, the hold released (the stopped job cannot
see it yet); the supervisor's pass, in a thread, finds the heartbeat stale and stops the job before
it restarts it; the moment its STOP file appears, the group gets SIGCONT, so the old job resumes and
commits its batch in the middle of the supervisor's stop: the worst moment for a second writer.

Oracle: the version's Delta log holds each micro-batch once (its application transaction), in order;
the old job was gone before the new one was launched (its `stop`, audited once its process group
ended, comes before the new job's `start` in the audit log), so no two jobs of the version ever wrote at once; one job recorded, the version
still serving, its lease free, one restart audited; the served table equals the oracle's.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pytest

from jobs.lib.sink.batches import HOLD_FILE, HOLD_HOOK
from orchestrator.context import Kappa
from orchestrator.core.settings import Settings
from orchestrator.dev import datagen
from orchestrator.jobctl import inspect_version, read_launch
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote
from orchestrator.lifecycle.supervise import supervise_version
from orchestrator.registry import Registry
from tests.faults.netfaults import delta_batches
from tests.integration.control.control_live import DEADLINE, PARTITIONS, PIPELINE, Live, make_spec, wait_exact
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.faults]

#: The heartbeat bound of this test's supervisor pass (the default is 30 s): a paused job is hung after it.
STALE = 6.0


def test_a_paused_serving_job_resumed_mid_stop_never_writes_beside_its_replacement(
        bootstrap, tmp_path, seed, monkeypatch, fault_row):
    unique = uuid.uuid4().hex[:8]
    topic, alias = f"profiles_{unique}", f"profiles_std_{unique}"
    datagen.ensure_topic(bootstrap, topic, PARTITIONS)
    reg = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    k = Kappa(Settings(home=tmp_path, bootstrap_servers=bootstrap), registry=reg,
              pipelines={PIPELINE: make_spec(topic, alias, restart_backoff_seconds=1.0)})
    live = Live(bootstrap, topic, alias, tmp_path, k, seed=seed)
    held = tmp_path / "held"
    try:
        live.produce(1000, 300, first_new=True)
        monkeypatch.setenv(HOLD_HOOK, "1")            # the first live batch after the backfill (batch 0)
        monkeypatch.setenv(HOLD_FILE, str(held))
        n = deploy(k, k.pipeline(PIPELINE), "v1", actor="setup", reason="serves, then is paused").version
        monkeypatch.delenv(HOLD_HOOK)
        v = k.version(PIPELINE, n)
        assert wait_ready(v, deadline_seconds=DEADLINE, poll_seconds=1).ready
        promote(v, actor="setup", reason="serves")
        live.produce(200, 300)
        wait_until(held.exists, "the live batch to be held before its commits", DEADLINE, poll=0.2)
        old = inspect_version(v)
        assert old.health == "running", old.describe()

        os.killpg(old.pid, signal.SIGSTOP)
        paused = time.monotonic()
        held.unlink()                             # released, but the stopped job cannot see it yet
        hung = wait_until(lambda: inspect_version(v, stale_after=STALE), "the paused job's heartbeat to go stale",
                          STALE * 10, poll=0.5, done=lambda st: st.failed)
        actions: list = []
        sup = threading.Thread(target=lambda: actions.append(supervise_version(v.reread(), hung, actor="supervisor")),
                               name="supervisor-pass")
        sup.start()
        try:
            wait_until(v.paths.stop_file.exists, "the supervisor to ask the hung job to stop", 60, poll=0.05)
        finally:
            os.killpg(old.pid, signal.SIGCONT)    # resumes mid-stop: it may commit its held batch now
        sup.join(120)
        assert not sup.is_alive(), "the supervisor's pass did not finish"
        paused_s = time.monotonic() - paused
        assert [a["kind"] for a in actions] == ["restart"], actions

        live.produce(200, 300)
        wait_exact(live, "the served table")
        healed_s = time.monotonic() - paused

        # no batch twice, in order; the old writer gone before the new one was launched
        commits = delta_batches(str(v.paths.table))
        batches = [b for _, _, b, _ in commits]
        assert len({app for _, app, _, _ in commits}) == 1, commits
        assert batches == sorted(set(batches)), f"a micro-batch committed twice or out of order: {commits}"
        new = inspect_version(v)
        assert new.pid != old.pid and new.health == "running", new.describe()
        stop = [e for e in reg.audit_log(PIPELINE, limit=None, version=n, action="stop")
                if (e.details or {}).get("pid") == old.pid]
        assert len(stop) == 1, stop
        # The stop is audited once the old group is gone, and the restart launches only after it: the
        # audit's order says so (the kernel's creation time is rounded to a second, too coarse here).
        starts = [e for e in reg.audit_log(PIPELINE, limit=None, version=n, action="start")
                  if (e.details or {}).get("pid") == new.pid]
        assert len(starts) == 1 and stop[0].id < starts[0].id, (stop, starts)
        assert read_launch(v)["pid"] == new.pid
        with pytest.raises(ProcessLookupError):
            os.killpg(old.pid, 0)
        rec = reg.get_version(PIPELINE, n)
        assert (rec.state, rec.pid, rec.lease_held()) == ("serving", new.pid, False), rec
        restarts = reg.audit_log(PIPELINE, limit=None, version=n, action="restart")
        assert [e.outcome for e in restarts] == ["ok"], restarts
        how = stop[0].details["how"]
        fault_row(scenario="job paused (SIGSTOP)", phase="live",
                   fault=f"SIGSTOP of the job's group past a {STALE:g} s heartbeat bound, SIGCONT mid-stop",
                   kappa=f"hung job stopped ({how}) before its restart; batches {batches}, each once",
                   healed_s=healed_s, exact=True, consistent=True)
        print(f"paused for {paused_s:.1f} s until the supervisor's pass finished")
    finally:
        if held.exists():
            held.unlink()
        live.close()
        reg.close()


#: The watch of the test below: a lag over this many seconds for `WATCH_SAMPLES` passes rolls v2 back.
WATCH_LAG, WATCH_SAMPLES = 2.0, 2


def test_a_paused_promoted_job_past_its_heartbeat_bound_is_decided_on_once_by_the_watch(
        bootstrap, tmp_path, seed, fault_row):
    """v1 promoted, v2 promoted with a watch (v1 its running standby); v2's job group SIGSTOPped while
    records arrive, past its heartbeat bound. The passes are called in order, by hand: watch pass 1
    (samples: lag over), watch pass 2 in a thread (decides: rolls back to v1, then stops v2, whose STOP
    file is the moment the group gets SIGCONT: it resumes mid-stop), then two monitor passes
    (supervision and the watch again).

    Oracle: one decision (the watch's `rolling_back` and its settling `rolled_back`, one flip by
    kappa-watch, no pass after it decides again); no second job of v2 ever (no start or restart of it
    after the pause; each of its Delta batches once, one application id); v1 serves alone, the alias
    published to it, the pointer on its table, v2 stopped with its lease free; the served table equals
    the oracle's."""
    from orchestrator.jobctl import inspect_version
    from orchestrator.lifecycle.monitor import monitor
    from orchestrator.lifecycle.watch import ACTOR, watch_of, watch_pass
    from orchestrator.observe.lag import measure_lag
    from orchestrator.serving import read_pointer

    unique = uuid.uuid4().hex[:8]
    topic, alias = f"profiles_{unique}", f"profiles_std_{unique}"
    datagen.ensure_topic(bootstrap, topic, PARTITIONS)
    reg = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    spec = make_spec(topic, alias, restart_backoff_seconds=1.0, auto_rollback=True, watch_max_lag_seconds=WATCH_LAG,
                     watch_lag_samples=WATCH_SAMPLES, watch_on_rollback="stop")
    k = Kappa(Settings(home=tmp_path, bootstrap_servers=bootstrap), registry=reg, pipelines={PIPELINE: spec})
    live = Live(bootstrap, topic, alias, tmp_path, k, seed=seed)
    paused_pid = None
    try:
        live.produce(600, 200, first_new=True)
        n1 = deploy(k, k.pipeline(PIPELINE), "v1", actor="setup", reason="serves first").version
        v1 = k.version(PIPELINE, n1)
        assert wait_ready(v1, deadline_seconds=DEADLINE, poll_seconds=1).ready
        promote(v1, actor="setup", reason="v1 serves")
        n2 = deploy(k, k.pipeline(PIPELINE), "v1", actor="setup", reason="promoted, then paused").version
        assert n2 != n1
        v2 = k.version(PIPELINE, n2)
        assert wait_ready(v2, deadline_seconds=DEADLINE, poll_seconds=1).ready
        promote(v2.reread(), actor="setup", reason="v2 serves, watched; v1 its standby")
        assert (watch_of(reg.get_version(PIPELINE, n2)) or {}).get("state") == "watching"
        standby_pid = inspect_version(v1).pid

        old = inspect_version(v2)
        assert old.health == "running", old.describe()
        os.killpg(old.pid, signal.SIGSTOP)
        paused_pid, paused, t_pause = old.pid, time.monotonic(), time.time()
        live.produce(200, 200)                     # v2 cannot read them: its lag in seconds grows
        wait_until(lambda: inspect_version(v2, stale_after=STALE), "the paused job's heartbeat to go stale",
                   STALE * 10, poll=0.5, done=lambda st: st.failed)
        wait_until(lambda: measure_lag(v2), f"v{n2}'s lag to pass {WATCH_LAG:g} s", DEADLINE, poll=0.5,
                   done=lambda r: r.lag_seconds is not None and r.lag_seconds > WATCH_LAG)

        first = watch_pass(k, k.pipeline(PIPELINE))
        assert [a["kind"] for a in first] == ["sampled"] and first[0]["sample"]["lag_over"] == 1, first
        second: list = []
        decider = threading.Thread(target=lambda: second.extend(watch_pass(k, k.pipeline(PIPELINE))),
                                   name="watch-pass-2")
        decider.start()
        try:
            wait_until(v2.paths.stop_file.exists, "the watch's rollback to stop the paused v2", DEADLINE, poll=0.05)
        finally:
            os.killpg(paused_pid, signal.SIGCONT)  # resumes mid-stop: it may commit a batch now
        decider.join(300)
        assert not decider.is_alive(), "the deciding watch pass did not finish"
        assert [(a["kind"], a.get("to_version"), a.get("degraded")) for a in second] == \
            [("rolled_back", n1, "stopped")], second
        later = [monitor(k, actor="supervisor", raise_on_problem=False) for _ in range(2)]
        again = [a for r in later for a in r.watched]
        assert again == [], f"a later pass decided again: {again}"

        wait_exact(live, "the served table")
        healed_s = time.monotonic() - paused

        # one decision
        watch = [(e.outcome, e.actor) for e in reg.audit_log(PIPELINE, limit=None, version=n2, action="watch")]
        assert watch == [("rolling_back", ACTOR), ("rolled_back", ACTOR)], watch
        flips = [e for e in reg.audit_log(PIPELINE, limit=None, action="rollback") if e.outcome == "ok"]
        assert [(e.actor, (e.details or {}).get("to_version", e.version)) for e in flips] == [(ACTOR, n1)], flips
        w = watch_of(reg.get_version(PIPELINE, n2))
        assert (w["state"], w.get("settled"), w.get("stopped")) == ("rolled_back", True, True), w
        # no second writer for v2: no job of it started after the pause, each batch once
        launched = [e for e in reg.audit_log(PIPELINE, limit=None, version=n2) if e.action in ("start", "restart")
                    and e.at >= t_pause]
        assert launched == [], f"a second job of v{n2} was launched: {launched}"
        commits = delta_batches(str(v2.paths.table))
        batches = [b for _, _, b, _ in commits]
        assert len({app for _, app, _, _ in commits}) == 1, commits
        assert batches == sorted(set(batches)), f"a micro-batch of v{n2} committed twice: {commits}"
        with pytest.raises(ProcessLookupError):
            os.killpg(paused_pid, 0)
        # the registry
        a = reg.get_alias(alias)
        assert (a.version, a.published_version, a.previous_version) == (n1, n1, n2), a
        pointer = read_pointer(k.alias_file(alias)) or {}
        assert (pointer.get("version"), pointer.get("table")) == (n1, str(v1.paths.table)), pointer
        r1, r2 = reg.get_version(PIPELINE, n1), reg.get_version(PIPELINE, n2)
        assert (str(r1.state), str(r2.state), r2.lease_held()) == ("serving", "stopped", False), (r1, r2)
        assert inspect_version(v1).pid == standby_pid, "the standby's job was replaced"
        fault_row(scenario="job paused (SIGSTOP)", phase="rollback (watch)",
                   fault=f"SIGSTOP of the promoted v2 past a {STALE:g} s heartbeat bound while records arrive; "
                         f"SIGCONT when the watch's rollback stops it",
                   kappa=f"watch decided once (lag > {WATCH_LAG:g} s for {WATCH_SAMPLES} passes): flipped to the "
                         f"running standby, stopped v2; no second v2 job; batches {batches}, each once",
                   healed_s=healed_s, exact=True, consistent=True)
    finally:
        if paused_pid is not None:
            try:
                os.killpg(paused_pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        live.close()
        reg.close()
