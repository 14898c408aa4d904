"""A broker that fails and comes back, under standardize jobs spawned by the orchestrator (Spark):
the jobs ride the outage out, or a dead one is restarted from its checkpoint by the supervisor,
and the table ends exactly the oracle's (tests/served.py) each time, nothing duplicated or lost.

The broker is a private Apache Kafka node for this module. It is stopped (a controlled shutdown)
or killed with SIGKILL, and started again on the same data folder and ports: its log survives, so
offsets stay what the checkpoints say. Spark's Kafka source (its driver's offset requests, its
executors' fetches) waits for it for `brokerOutageSeconds` (`jobs.lib.runtime.stream`); the Kafka
client logs that the node may not be available. A backfill meets the outage at a known point: its
micro-batch is held before its commit (`KAPPA_TEST_HOLD_BEFORE_COMMIT`), the broker goes down, and
the batch is released, so the live query that follows it needs the broker that is not there.

Until reconcile calls `supervise_version` itself (the lead wires it), the supervisor's passes here
call it directly for every running version whose job failed, as reconcile will.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from contextlib import contextmanager

import pytest

from control_live import DEADLINE, PARTITIONS, PIPELINE, Live, make_spec, served_equals_expected, wait_exact
from orchestrator.context import Kappa
from orchestrator.core.settings import Settings
from orchestrator.core.states import RUNNING
from orchestrator.dev import datagen
from jobs.lib.sink.batches import HOLD_FILE, HOLD_HOOK
from orchestrator.dev.broker import EmbeddedBroker
from orchestrator.jobctl import inspect_version, read_launch, stop_version
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote
from orchestrator.lifecycle.supervise import supervise_version
from orchestrator.registry import Registry
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

INITIAL = 2000
KEYS = 600
#: How long the broker stays down for a job that must ride it out: several of the source's retries,
#: well under the default brokerOutageSeconds (120).
DOWN_SECONDS = 12.0
#: The supervision test's jobs give up on the broker after this long, so the outage kills them.
SHORT_OUTAGE = 10


@pytest.fixture(scope="module")
def private_broker(tmp_path_factory):
    b = EmbeddedBroker(tmp_path_factory.mktemp("sup-broker")).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="module")
def live(private_broker, tmp_path_factory, module_seed):
    unique = uuid.uuid4().hex[:8]
    topic, alias = f"profiles_{unique}", f"profiles_std_{unique}"
    bootstrap = private_broker.bootstrap_servers
    datagen.ensure_topic(bootstrap, topic, PARTITIONS)
    home = tmp_path_factory.mktemp("kappa-supervision")
    reg = Registry(f"sqlite:///{home / 'registry.db'}")
    k = Kappa(Settings(home=home, bootstrap_servers=bootstrap), registry=reg,
              pipelines={PIPELINE: make_spec(topic, alias, restart_backoff_seconds=2.0)})
    lv = Live(bootstrap, topic, alias, home, k, seed=module_seed)
    try:
        lv.produce(INITIAL, KEYS, first_new=True)
        info = deploy(k, k.pipeline(PIPELINE), "v1", actor="setup", reason="v1 serves for the supervision tests")
        assert wait_ready(k.version(PIPELINE, info.version), deadline_seconds=DEADLINE, poll_seconds=1).ready
        promote(k.version(PIPELINE, info.version), actor="setup", reason="v1 serves")
        yield lv
    finally:
        lv.close()
        reg.close()


@contextmanager
def broker_down(broker: EmbeddedBroker, how: str):
    """The broker stopped (`stop`: a controlled shutdown; `kill`: SIGKILL) until the block ends,
    then started again on its data folder and ports, whatever happens inside."""
    pid = broker.pid
    broker.stop() if how == "stop" else broker.kill()
    try:
        yield
    finally:
        broker.start()
        assert broker.pid != pid


def served_exactly(live: Live, what: str) -> None:
    wait_exact(live, f"the served table {what}")


def supervise_pass(k, actions: list) -> None:
    """What reconcile does once wired: supervise every running version whose job failed."""
    for v in k.versions(PIPELINE):
        if v.record.state in RUNNING:
            st = inspect_version(v)
            if st.failed:
                actions.append(supervise_version(v, st, actor="supervisor"))


def serving_version(live: Live) -> int:
    return live.k.registry.get_alias(live.alias).version


def test_a_serving_job_rides_out_a_broker_that_is_killed_and_comes_back(live, private_broker):
    """A broker killed (SIGKILL) under the serving job; the controlled stop is the next test's."""
    how = "kill"
    v = serving_version(live)
    before = inspect_version(live.k.version(PIPELINE, v))
    assert before.health == "running", before.describe()
    with broker_down(private_broker, how):
        # The outage itself is the time that must pass: the job's heartbeat goes on, its source waits.
        time.sleep(DOWN_SECONDS)
        during = inspect_version(live.k.version(PIPELINE, v))
        assert not during.failed, during.describe()
    live.produce(300, KEYS)
    served_exactly(live, f"after the broker's {how} and start")
    after = inspect_version(live.k.version(PIPELINE, v))
    assert after.pid == before.pid and after.health == "running", after.describe()
    log_text = open(before.log_file, errors="replace").read()
    assert "may not be available" in log_text, "the job's Kafka client never saw the broker gone"
    assert live.k.registry.audit_log(PIPELINE, limit=None, version=v, action="restart") == []


def test_a_backfill_rides_out_a_broker_stop_then_a_restart_after_its_rules_file_was_edited_keeps_its_rules(
        live, private_broker, tmp_path, monkeypatch):
    """The backfill of a new version, stopped at a known point: its micro-batch is read and held
    before its commit; the broker stops; the batch is released and commits; the live query after it
    waits for the broker, which comes back after DOWN_SECONDS. The version catches up with exactly
    the oracle's table, and its job never restarted. The serving job rides out the same stop: same
    process, no restart, and its table takes the updates produced after the broker came back.

    Then issue 20's case on the same version (one deploy and backfill for both): it was deployed
    with the team's titles/v1.toml, the file is then edited ("Software Engineer" renamed), the job
    killed with SIGKILL and restarted by the supervisor. The restarted job runs the rules stored at
    the deploy: the version's table, after more records, is exactly the oracle's table for the
    original v1 rules (tests/oracle, worked out by hand)."""
    import shutil

    from jobs.lib.rules.files import RULES_DIR, load_rules
    from orchestrator.jobctl.version_rules import file_state

    team = tmp_path / "team-repo" / "rules"
    shutil.copytree(RULES_DIR / "titles", team / "titles")
    held = tmp_path / "held"
    monkeypatch.setenv(HOLD_HOOK, "0")
    monkeypatch.setenv(HOLD_FILE, str(held))
    spec = live.k.pipeline(PIPELINE).model_copy(update={"max_records_per_batch": 300})
    k = Kappa(live.k.settings.model_copy(update={"rules_location": str(team)}), registry=live.k.registry,
              pipelines={PIPELINE: spec})
    serving = serving_version(live)
    serving_before = inspect_version(live.k.version(PIPELINE, serving))
    assert serving_before.health == "running", serving_before.describe()
    info = deploy(k, k.pipeline(PIPELINE), "v1", actor="tests", reason="a backfill meets a broker outage; the team's v1 rules")
    monkeypatch.delenv(HOLD_HOOK)
    wait_until(held.exists, "the first batch of the backfill to be held before its commit", DEADLINE, poll=0.2)
    pid = inspect_version(k.version(PIPELINE, info.version)).pid
    with broker_down(private_broker, "stop"):
        held.unlink()                                       # the batch commits; the next one needs the broker
        time.sleep(DOWN_SECONDS)
        st = inspect_version(k.version(PIPELINE, info.version))
        assert not st.failed and st.pid == pid, st.describe()
        during = inspect_version(live.k.version(PIPELINE, serving))
        assert not during.failed, during.describe()
    live.produce(300, KEYS)
    served_exactly(live, "after the broker's stop and start")
    after = inspect_version(live.k.version(PIPELINE, serving))
    assert after.pid == serving_before.pid and after.health == "running", after.describe()
    assert "may not be available" in open(serving_before.log_file, errors="replace").read()
    assert live.k.registry.audit_log(PIPELINE, limit=None, version=serving, action="restart") == []
    assert wait_ready(k.version(PIPELINE, info.version), deadline_seconds=DEADLINE, poll_seconds=1).ready
    ok, msg = served_equals_expected(live, "v1", version=info.version)
    assert ok, msg
    st = inspect_version(k.version(PIPELINE, info.version))
    assert st.pid == pid and st.health == "running", st.describe()
    assert "may not be available" in open(st.log_file, errors="replace").read()
    assert k.registry.audit_log(PIPELINE, limit=None, version=info.version, action="restart") == []

    # issue 20: the rules file edited after the deploy, the job killed and restarted by the supervisor
    path = team / "titles" / "v1.toml"
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace('"Software Engineer" = [', '"Software Eng." = [')
                    .replace('canonical = "Software Engineer"', 'canonical = "Software Eng."'), encoding="utf-8")
    rec = k.registry.get_version(PIPELINE, info.version)
    assert load_rules(path).content_hash != rec.rules_hash and file_state(k.version(PIPELINE, info.version)) == "changed"

    old = inspect_version(k.version(PIPELINE, info.version))
    os.killpg(old.pid, signal.SIGKILL)
    wait_until(lambda: inspect_version(k.version(PIPELINE, info.version)).failed, "the killed job to count as dead", 60)
    actions: list = []
    supervise_pass(k, actions)
    assert [a["kind"] for a in actions] == ["restart"], actions
    wait_until(lambda: inspect_version(k.version(PIPELINE, info.version)).health == "running", "the restarted job to run",
               DEADLINE)
    live.produce(300, KEYS)                  # new records, titles included, standardized after the edit
    wait_exact(live, f"v{info.version}'s table, for the original v1 rules,", version=info.version)
    st = inspect_version(k.version(PIPELINE, info.version))
    assert st.rules_hash == rec.rules_hash, (st.rules_hash, rec.rules_hash)
    # stopped here: the next test's broker outage then meets the serving job alone
    stop_version(k.version(PIPELINE, info.version), actor="tests", reason="done", force=True, final_state=None)


def test_a_killed_serving_job_and_a_broker_outage_are_supervised_back_to_an_exact_table(live, private_broker):
    # the restarted jobs give up on a missing broker after SHORT_OUTAGE s, so an outage kills them
    spec = live.k.pipeline(PIPELINE).model_copy(update={"options": {"source_options": {
        "brokerOutageSeconds": str(SHORT_OUTAGE)}}})
    k = Kappa(live.k.settings, registry=live.k.registry, pipelines={PIPELINE: spec})
    v = serving_version(live)
    old = inspect_version(k.version(PIPELINE, v))
    os.killpg(old.pid, signal.SIGKILL)                      # kill -9 of the whole job: JVM and workers
    wait_until(lambda: inspect_version(k.version(PIPELINE, v)).failed, "the killed job to count as dead", 60)
    actions: list = []
    supervise_pass(k, actions)
    assert [a["kind"] for a in actions] == ["restart"], actions
    assert read_launch(k.version(PIPELINE, v))["resumed"] is True   # from its own checkpoint, not offset zero
    assert k.registry.get_version(PIPELINE, v).state == "serving"
    wait_until(lambda: inspect_version(k.version(PIPELINE, v)).health == "running", "the restarted job to run", DEADLINE)
    live.produce(300, KEYS)
    served_exactly(live, "after the kill -9 and the restart")

    with broker_down(private_broker, "kill"):              # longer than the job's brokerOutageSeconds
        wait_until(lambda: inspect_version(k.version(PIPELINE, v)).failed, "the job to give up on the missing broker",
                   DEADLINE, poll=1.0)
    st = inspect_version(k.version(PIPELINE, v))
    assert re.search(r"SourceError: broker unavailable: .*brokerOutageSeconds=10", st.error or ""), st.error
    actions = []
    wait_until(lambda: supervise_pass(k, actions) or (actions and actions[-1]["kind"] == "restart"),
               "the supervisor to restart the job after the outage", DEADLINE, poll=1.0)
    assert {a["kind"] for a in actions} <= {"restart", "restart_pending"}, actions
    wait_until(lambda: inspect_version(k.version(PIPELINE, v)).health == "running", "the job to run again", DEADLINE)
    live.produce(300, KEYS)
    served_exactly(live, "after the broker outage and the restart")
    entries = k.registry.audit_log(PIPELINE, limit=None, version=v, action="restart")
    assert [e.outcome for e in entries] == ["ok", "ok"] and entries[1].details["failure"] == "broker_unavailable"
    assert k.registry.get_version(PIPELINE, v).state == "serving"
