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
from tests.faults.netfaults import delta_batches, fault_line
from tests.integration.control.control_live import DEADLINE, PARTITIONS, PIPELINE, Live, make_spec, \
    served_equals_expected
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.faults]

#: The heartbeat bound of this test's supervisor pass (the default is 30 s): a paused job is hung after it.
STALE = 6.0


def test_a_paused_serving_job_resumed_mid_stop_never_writes_beside_its_replacement(
        bootstrap, tmp_path, seed, monkeypatch):
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
        wait_until(lambda: served_equals_expected(live, "v1"), "the served table to equal the oracle's", DEADLINE,
                   poll=1.0, done=lambda r: r[0])
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
        fault_line(scenario="job paused (SIGSTOP)", phase="live",
                   fault=f"SIGSTOP of the job's group past a {STALE:g} s heartbeat bound, SIGCONT mid-stop",
                   kappa=f"hung job stopped ({how}) before its restart; batches {batches}, each once",
                   healed_s=healed_s, exact=True, consistent=True)
        print(f"paused for {paused_s:.1f} s until the supervisor's pass finished")
    finally:
        if held.exists():
            held.unlink()
        live.close()
        reg.close()
