"""Fault scenario 2 (issue 33): the Kafka broker killed with SIGKILL mid-MERGE and mid-transaction.

The broker is a dedicated embedded Apache Kafka node for this module (the session broker other tests
use is never touched). It is killed with SIGKILL (`os.kill` of its own PID: no controlled shutdown, no
flush, its transaction coordinator's in-memory state lost) and started again on the same data folder
and ports. One real standardize job (Spark local, delta-spark) serves all three phases, each forced to
a known point:

1. backfill: micro-batch 0 of a new version is read and held before its Delta commits
   (`KAPPA_TEST_HOLD_BEFORE_COMMIT`); the broker is killed; the batch is released, and its write (which
   needs no broker: the batch is persisted) commits while the broker is down; the live query that
   follows needs the broker that is not there;
2. live: with the version serving, live micro-batch 1 (a MERGE into the served table) is held the same
   way, the broker killed, the MERGE released while it is down; the batches after it need the broker;
3. open transaction: a transactional producer (`transactional.id`) commits a transaction, begins a
   second one, produces records with distinctive values (every one of them flushed to the log), and
   the broker is killed before that transaction commits. After the restart a new producer with the same
   `transactional.id` calls `init_transactions`, which fences the old one and makes the coordinator
   abort its transaction; a third transaction commits after it.

Oracle, once the broker is back: the version's table (and, once it serves, the served table through
the alias) is exactly the oracle's derivation (tests/served.py) of the log as a read_committed
consumer sees it: the aborted transaction's records are in the log (a read_uncommitted read sees
them) and nowhere in the table or its rejects; nothing committed is lost or doubled. The job rides the
outage out (the supervisor restarts it from its checkpoint if it died: `supervise_version`). While the
broker is down, the version's lag sample in the registry is unknown (None), never 0. The registry is
consistent: the version's states seen move only as the control-plane model allows, it alone serves,
the alias is published to it and the pointer file names its table.

4. promote (fake log, fake jobs, like scenarios 3 and 4's promote): with the broker down the promote is
   refused in one line (unknown lag never counts as caught up) and changes nothing; once it is back and
   the version has caught up again, the same command completes.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from jobs.lib.sink.batches import HOLD_FILE, HOLD_HOOK
from orchestrator.context import Kappa
from orchestrator.core.settings import Settings
from orchestrator.core.states import VersionState
from orchestrator.dev import datagen
from orchestrator.dev.broker import EmbeddedBroker
from orchestrator.jobctl import inspect_version
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote
from orchestrator.lifecycle.supervise import supervise_version
from orchestrator.observe.lag import sample_lag
from orchestrator.registry import Registry
from orchestrator.serving import read_pointer
from tests.integration.control.control_live import DEADLINE, PARTITIONS, PIPELINE, Live, make_spec, wait_exact
from tests.unit.control.model_checks import legal_move
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.faults]

INITIAL, KEYS, LIVE = 300, 100, 40
#: The batches held before their commits: the backfill (0) and the first live batch (1), one job process.
HOLDS = "0,1"
#: A broker call of a lag sample taken while the broker is down gives up after this long (unknown lag).
LAG_TIMEOUT = 2.0
SCENARIO = "broker SIGKILL"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = EmbeddedBroker(tmp_path_factory.mktemp("kill-broker"), heap="512m").start()
    try:
        yield b
    finally:
        b.stop()


def kill_broker(b: EmbeddedBroker) -> float:
    """SIGKILL the broker's own PID (no controlled shutdown); the moment it died."""
    proc = b.proc
    assert proc is not None and proc.poll() is None, "the broker is not running"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    b.proc = None
    return time.monotonic()


def restart_broker(b: EmbeddedBroker, killed_pid: int) -> None:
    """Start it again on its data folder and ports (it recovers its logs after the unclean stop)."""
    b.start(timeout=120)
    assert b.pid != killed_pid


@pytest.fixture(scope="module")
def stack(broker, tmp_path_factory, module_seed):
    unique = uuid.uuid4().hex[:8]
    topic, alias = f"brokerkill_{unique}", f"brokerkill_std_{unique}"
    bootstrap = broker.bootstrap_servers
    datagen.ensure_topic(bootstrap, topic, PARTITIONS)
    home = tmp_path_factory.mktemp("kappa-broker-kill")
    reg = Registry(f"sqlite:///{home / 'registry.db'}")
    k = Kappa(Settings(home=home, bootstrap_servers=bootstrap), registry=reg,
              pipelines={PIPELINE: make_spec(topic, alias, restart_backoff_seconds=1.0)})
    lv = Live(bootstrap, topic, alias, home, k, seed=module_seed)
    try:
        lv.produce(INITIAL, KEYS, first_new=True)
        yield lv
    finally:
        lv.close()
        reg.close()


def delta_txn_versions(table: str) -> set[int]:
    """The application-transaction versions (kappa's micro-batch ids) committed to a Delta table."""
    log = Path(table) / "_delta_log"
    out: set[int] = set()
    for f in sorted(log.glob("*.json")) if log.is_dir() else []:
        for line in f.read_text().splitlines():
            action = json.loads(line)          # a torn commit fails here
            if "txn" in action:
                out.add(int(action["txn"]["version"]))
    return out


class Watch:
    """The version's registry states as seen during a phase, and a supervisor's pass when its job died."""

    def __init__(self, live: Live, v: int):
        self.live, self.v = live, v
        self.states: list[str] = [str(live.k.registry.get_version(PIPELINE, v).state)]
        self.restarts: list[dict] = []

    def look(self) -> None:
        s = str(self.live.k.registry.get_version(PIPELINE, self.v).state)
        if s != self.states[-1]:
            self.states.append(s)
        vr = self.live.k.version(PIPELINE, self.v)
        st = inspect_version(vr)
        if st.failed:
            action = supervise_version(vr, st, actor="supervisor")
            if action and action.get("kind") == "restart":
                self.restarts.append(action)

    def exact(self, what: str, *, version: int | None = None) -> None:
        """Wait until the served table (or `version`'s own) equals the oracle, supervising meanwhile."""
        # an exception: a table not written yet (the job still catches up)
        wait_exact(self.live, what, version=version, each=self.look, catch=(Exception,))

    def problems(self, *, serving: bool) -> list[str]:
        """What is inconsistent in the registry: illegal moves, the alias, the pointer, who serves."""
        k, v, out = self.live.k, self.v, []
        self.look()
        for before, after in zip(self.states, self.states[1:]):
            if not legal_move(before, after, flip_ends_path=False):
                out.append(f"v{v} went {before} -> {after}, not a move the model allows")
        if self.restarts:
            print(f"\nv{v}: the supervisor restarted its job {len(self.restarts)} time(s): {self.restarts}")
        if serving:
            alias = k.registry.get_alias(self.live.alias)
            if alias is None or (alias.version, alias.published_version) != (v, v):
                out.append(f"the alias is {alias and (alias.version, alias.published_version)}, not v{v} published")
            pointer = read_pointer(k.alias_file(self.live.alias)) or {}
            if (pointer.get("version"), pointer.get("table")) != (v, str(k.paths(PIPELINE, v).table)):
                out.append(f"the pointer file holds {pointer}, not v{v}'s table")
            serving_now = [r.version for r in k.registry.list_versions(PIPELINE) if r.state == VersionState.SERVING]
            if serving_now != [v]:
                out.append(f"serving: {serving_now}, expected v{v} alone")
        return out

    def did(self, rode_out: str) -> str:
        if self.restarts:
            return f"job died ({(self.restarts[0].get('failure') or '?')}); supervisor restarted it from its checkpoint"
        return rode_out


def lag_while_down(live: Live, v: int) -> str:
    """A lag sample taken while the broker is down: unknown in the reading and in the registry, never 0."""
    vr = live.k.version(PIPELINE, v)
    reading = sample_lag(vr, timeout=LAG_TIMEOUT)
    stored = live.k.registry.lag_samples(PIPELINE, v, limit=1)
    stored = stored[-1] if stored else None
    assert reading.total is None and reading.error, f"lag read while the broker is down: {reading}"
    assert reading.lag_seconds is None, reading
    assert stored is not None and stored.id == reading.sample_id and stored.total is None, stored
    return reading.error


def _held(path: Path) -> None:
    wait_until(path.exists, f"the job's micro-batch to be held before its commits ({path})", DEADLINE, poll=0.2)


def test_broker_killed_during_the_backfill_then_mid_merge_of_a_live_batch(stack, broker, tmp_path_factory,
                                                                           fault_row):
    live, k = stack, stack.k
    held = tmp_path_factory.mktemp("holds") / "held"
    os.environ[HOLD_HOOK], os.environ[HOLD_FILE] = HOLDS, str(held)   # the job inherits them at its start
    try:
        v = deploy(k, k.pipeline(PIPELINE), "v1", actor="fault-test", reason="broker SIGKILL scenario").version
    finally:
        os.environ.pop(HOLD_HOOK), os.environ.pop(HOLD_FILE)
    table = str(k.paths(PIPELINE, v).table)
    job = inspect_version(k.version(PIPELINE, v)).pid

    # -- phase 1: batch 0 (the backfill) read, held before its commits; the broker dies ------------------
    _held(held)
    watch = Watch(live, v)
    pid = broker.pid
    t0 = kill_broker(broker)
    held.unlink()
    wait_until(lambda: delta_txn_versions(table), "the backfill's batch 0 to commit while the broker is down",
               DEADLINE, poll=0.5, done=lambda got: got == {0})
    error = lag_while_down(live, v)
    print(f"\nbackfill, broker down: lag unknown ({error[:120]})")
    assert broker.proc is None    # the commit above and the unknown lag were all while it was down
    restart_broker(broker, pid)
    watch.exact(f"v{v}'s table after the broker's restart", version=v)
    healed = time.monotonic() - t0
    assert wait_ready(k.version(PIPELINE, v), deadline_seconds=DEADLINE, poll_seconds=1).ready
    promote(k.version(PIPELINE, v), actor="fault-test", reason="serve the version that rode out a broker SIGKILL")
    problems = watch.problems(serving=True)
    fault_row(scenario=SCENARIO, phase="backfill",
              fault="broker SIGKILLed while micro-batch 0 was held before its Delta commit; restarted on its data",
              kappa=watch.did("batch 0 committed with the broker down (lag sampled unknown), the live query waited "
                              "for the broker; no restart"),
              healed_s=healed, exact=True, consistent=not problems)
    assert not problems, problems

    # -- phase 2: live batch 1, a MERGE into the served table, held; the broker dies ----------------------
    watch = Watch(live, v)
    live.produce(LIVE, KEYS)
    _held(held)
    before = delta_txn_versions(table)
    assert 1 not in before, before
    pid = broker.pid
    t0 = kill_broker(broker)
    held.unlink()
    wait_until(lambda: delta_txn_versions(table), "the live MERGE of batch 1 to commit while the broker is down",
               DEADLINE, poll=0.5, done=lambda got: 1 in got)
    lag_while_down(live, v)
    assert broker.proc is None
    restart_broker(broker, pid)
    live.produce(LIVE, KEYS)       # the batches after the MERGE need the broker back
    watch.exact("the served table after the broker's restart")
    healed = time.monotonic() - t0
    if not watch.restarts:
        assert inspect_version(k.version(PIPELINE, v)).pid == job, "the job was restarted, yet no supervisor did it"
    problems = watch.problems(serving=True)
    fault_row(scenario=SCENARIO, phase="live",
              fault="broker SIGKILLed while live micro-batch 1 (a MERGE) was held before its Delta commit",
              kappa=watch.did("MERGE committed with the broker down (lag sampled unknown), next batches waited "
                              "for the broker; no restart"),
              healed_s=healed, exact=True, consistent=not problems)
    assert not problems, problems


def _profile(name: str) -> bytes:
    return json.dumps({"name": name, "title": "Software Engineer", "company": "Acme", "location": "Berlin, Germany",
                       "updated_at": "2030-01-01T00:00:00Z"}).encode()


def _transaction(p: Producer, topic: str, tag: str, keys: list[bytes], *, commit: bool = True) -> dict[bytes, str]:
    """One transaction of `p` writing a distinctive name to each key (its partition as datagen's);
    committed, or left open with every record flushed to the log."""
    p.begin_transaction()
    names = {key: f"{tag} {key.decode()}" for key in keys}
    for key, name in names.items():
        p.produce(topic, key=key, value=_profile(name), partition=datagen.partition_for(key, PARTITIONS))
    if commit:
        p.commit_transaction(60)
    else:
        assert p.flush(60) == 0, "the open transaction's records did not all reach the broker"
    return names


def test_broker_killed_with_a_producer_transaction_open(stack, broker, fault_row):
    live, k = stack, stack.k
    v = k.registry.get_alias(live.alias).version
    watch = Watch(live, v)
    job = inspect_version(k.version(PIPELINE, v)).pid
    tx_id = f"brokerkill-tx-{uuid.uuid4().hex[:8]}"
    old = [datagen.member_key(n) for n in range(0, KEYS, 7)]            # members the table holds
    new = [datagen.member_key(KEYS + n) for n in range(8)]                # members it never held
    conf = {"bootstrap.servers": live.bootstrap, "transactional.id": tx_id, "transaction.timeout.ms": 60000}

    first = Producer(conf)
    first.init_transactions(60)
    committed = _transaction(first, live.topic, "TXN-COMMITTED-BEFORE", old[::2] + new[:4])
    aborted = _transaction(first, live.topic, "TXN-ABORTED", old + new, commit=False)

    pid = broker.pid
    t0 = kill_broker(broker)
    lag_while_down(live, v)
    restart_broker(broker, pid)
    second = Producer(conf)
    second.init_transactions(60)        # fences `first`: the coordinator aborts its open transaction
    del first
    committed.update(_transaction(second, live.topic, "TXN-COMMITTED-AFTER", old[1::2] + new[6:]))
    del second
    live.produce(LIVE, KEYS)            # plain records after the aborted ones, on every partition

    # The aborted records are in the log (a read_uncommitted consumer sees them): the oracle is not vacuous.
    uncommitted = {r.value.decode() for r in datagen.iter_log(live.bootstrap, live.topic,
                                                             config={"isolation.level": "read_uncommitted"})
                   if r.value and b"TXN-ABORTED" in r.value}
    assert len(uncommitted) == len(aborted), f"{len(uncommitted)} of the {len(aborted)} aborted records in the log"
    assert not [r for r in datagen.iter_log(live.bootstrap, live.topic) if r.value and b"TXN-ABORTED" in r.value], \
        "a read_committed read of the log returns records of the aborted transaction"
    watch.exact("the served table after the broker's restart and the transaction's abort")
    healed = time.monotonic() - t0

    from orchestrator.core.tables import read_table
    from orchestrator.serving import open_alias
    served = read_table(open_alias(live.alias, live.settings))
    names = dict(zip(served.column("member_id").to_pylist(), served.column("name").to_pylist()))
    leaked = {m: n for m, n in names.items() if n and "TXN-ABORTED" in n}
    assert not leaked, f"records of the aborted transaction reached the served table: {leaked}"
    rejects = read_table(str(k.paths(PIPELINE, v).rejects))
    assert not [r for r in rejects.column("value").to_pylist() if r and b"TXN-ABORTED" in r]
    # the committed transactions' last writes went through (unless a later plain record of the key won)
    seen = {m for m, n in names.items() if n and n.startswith("TXN-COMMITTED")}
    assert {key.decode() for key in new[:4] + new[6:]} <= seen, (sorted(seen), committed)
    assert not {key.decode() for key in new[4:6]} & set(names), "members only the aborted transaction wrote are served"
    lag = wait_until(lambda: sample_lag(k.version(PIPELINE, v)), "the lag to come back to 0 past the abort markers",
                     DEADLINE, poll=1.0, done=lambda r: r.total == 0)
    if not watch.restarts:
        assert inspect_version(k.version(PIPELINE, v)).pid == job, "the job was restarted, yet no supervisor did it"
    problems = watch.problems(serving=True)
    fault_row(scenario=SCENARIO, phase="live (open transaction)",
              fault="broker SIGKILLed with a producer's transaction open (its records flushed); aborted on restart "
                    "by init_transactions of the same transactional.id",
              kappa=watch.did(f"job read read_committed: no aborted record in table or rejects; lag unknown while "
                              f"down, then {lag.total}; no restart"),
              healed_s=healed, exact=True, consistent=not problems)
    assert not problems, problems


def test_broker_killed_then_a_rollback_to_the_running_standby(stack, broker, fault_row):
    """The real stack: v_a serves (the phases above), v_b is deployed and promoted over it, so v_a is a
    running standby; the broker is SIGKILLed. A rollback to v_a is refused after its first lag sample,
    in one line (lag unknown: broker unreachable; --force flips anyway), moving nothing; with --force it
    flips at once, audited as forced. Neither stops v_a's job (its jobs wait for the broker
    `brokerOutageSeconds`, 120 s by default, longer than both rollbacks). Once the broker is back: the
    served table (v_a's, through the alias) equals the oracle, the registry is consistent, v_a's job is
    the one that ran before, never stopped."""
    from orchestrator.core.exceptions import NotReadyError
    from orchestrator.lifecycle.rollback import rollback

    live, k = stack, stack.k
    va = k.registry.get_alias(live.alias).version
    vb = deploy(k, k.pipeline(PIPELINE), "v1", actor="fault-test", reason="serves over v_a, then rolled back").version
    assert wait_ready(k.version(PIPELINE, vb), deadline_seconds=DEADLINE, poll_seconds=1).ready
    promote(k.version(PIPELINE, vb), actor="fault-test", reason="v_a becomes the running standby")
    standby = inspect_version(k.version(PIPELINE, va))
    assert standby.health == "running" and str(k.registry.get_version(PIPELINE, va).state) == "standby"
    watch = Watch(live, va)
    t_wall = time.time()
    pid = broker.pid
    t0 = kill_broker(broker)
    samples: list = []
    with pytest.raises(NotReadyError) as refused:
        rollback(k, k.pipeline(PIPELINE), actor="fault-test", reason="v_b is bad; the broker is down",
                 on_sample=samples.append)
    msg = str(refused.value)
    print(f"\nrollback, broker killed: {msg}")
    assert len(samples) == 1, f"the rollback polled an unknown lag {len(samples)} times"
    assert "\n" not in msg and "unknown because the Kafka broker is unreachable" in msg and "--force" in msg, msg
    assert k.registry.get_alias(live.alias).version == vb
    samples.clear()
    res = rollback(k, k.pipeline(PIPELINE), actor="fault-test", reason="roll back now, broker or not", force=True,
                   on_sample=samples.append)
    print(f"\nforced rollback, broker killed: {res.message}")
    assert (res.flipped, res.forced, len(samples)) == (True, True, 1), res
    flip = k.registry.audit_log(PIPELINE, action="rollback")[-1]
    assert (flip.outcome, flip.details["forced"], flip.details["readiness"]["lag"]) == ("ok", ["ready"], None)
    assert broker.proc is None, "the broker came back before both rollbacks were done"
    restart_broker(broker, pid)
    live.produce(LIVE, KEYS)
    watch.exact("the served table (v_a) after the forced rollback and the broker's restart")
    healed = time.monotonic() - t0
    problems = watch.problems(serving=True)
    stops = [e for e in k.registry.audit_log(PIPELINE, limit=None, version=va, action="stop") if e.at >= t_wall]
    if stops or (not watch.restarts and inspect_version(k.version(PIPELINE, va)).pid != standby.pid):
        problems.append(f"the standby v{va}'s job was stopped or replaced: {stops}")
    fault_row(scenario=SCENARIO, phase="rollback",
              fault="broker SIGKILLed with v_b serving, v_a its running standby; `rollback`, then `rollback --force`",
              kappa=watch.did("refused at once in one line (lag unknown: broker unreachable; --force flips anyway); "
                              "--force flipped at once, audited as forced; the standby's job never stopped"),
              healed_s=healed, exact=True, consistent=not problems)
    assert not problems, problems


# The real-stack tests come before the fake-log ones below: their fixture's teardown ends this process's
# child processes (`end_children`), the real jobs of the module's stack included.

# -- promote: the control plane's only use of the broker there is the lag it reads ---------------------
# It runs on the fault suite's fake log with fake jobs (like scenarios 3 and 4's promote): a broker
# killed with SIGKILL is, to a promote, lag reads that fail (the fake log's `down`: BrokerUnreachable from the
# log end offsets, as `orchestrator.observe.lag.log_offsets` raises against a dead broker).

@pytest.fixture
def control_bed(tmp_path, monkeypatch):
    from orchestrator.core.settings import resolve_settings
    from tests.faults.fault_helpers import PIPELINES, Bed
    from tests.unit.control.control_helpers import FakeLog, end_children

    for var in list(os.environ):
        if var.startswith("KAPPA_"):
            monkeypatch.delenv(var)
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(PIPELINES)
    home = tmp_path / "home"
    url = f"sqlite:///{home / 'registry.db'}"
    k = Kappa(resolve_settings(home=str(home), pipelines_file=str(pipelines), bootstrap_servers="127.0.0.1:9",
                               registry_url=url, warehouse=str(tmp_path / "warehouse"), env={}))
    try:
        yield Bed(k, home, pipelines, url, FakeLog({0: 100, 1: 50}).install(monkeypatch))
    finally:
        end_children()
        k.close()


def test_broker_down_through_a_promote(control_bed, fault_row):
    from tests.faults.fault_helpers import flips, one_line_error, oracle, serving_v1_then_v2_ready
    from tests.unit.control.control_helpers import ALIAS, PIPELINE as CONTROL, samples_a_batch_apart

    bed, verb, served = control_bed, "promote", 2
    serving_v1_then_v2_ready(bed, v2_serves=False)
    args = ["promote", CONTROL, "2"]
    before = len(flips(bed))
    alias_before = bed.k.registry.get_alias(ALIAS)
    bed.fake_log.down = True
    t0 = time.monotonic()
    first = bed.run(*args, "--actor", "fault-test", "--reason", "the broker is down")
    assert first.exit_code != 0, "a promote with the broker down went through: its lag could not be read"
    line = one_line_error(first, "lag unknown", "never counts as caught up")
    print(f"\n{verb}, broker down: {line}")
    alias_now = bed.k.registry.get_alias(ALIAS)
    assert (alias_now.version, alias_now.published_version) == (alias_before.version, alias_before.published_version)
    assert len(flips(bed)) == before, "a refused promote moved the alias"
    did = ("refused in one line (lag unknown never counts as caught up), alias unchanged; once the broker is "
           "back, v2 caught up again over new samples and the promote completed")
    bed.fake_log.down = False
    # the unknown sample broke v2's run of caught-up samples: it needs new ones, a micro-batch apart
    samples_a_batch_apart(bed.k, 2, 3, record=True, actor="monitor")
    again = bed.run(*args, "--actor", "fault-test", "--reason", "retry once the broker is back")
    assert again.exit_code == 0, f"the retry did not complete: {again.output}"
    rec = bed.run("reconcile", "--actor", "fault-test")
    assert rec.exit_code == 0, rec.output
    exact, consistent, problems = oracle(bed, served)
    moved = flips(bed)[before:]
    if [(e.details or {}).get("to_version") for e in moved] != [served]:
        consistent = False
        problems.append(f"the alias moved {len(moved)} times: {[(e.details or {}) for e in moved]}")
    fault_row(scenario=SCENARIO, phase=verb, fault=f"broker down (lag reads fail) through `kappa {verb}`; fake log",
              kappa=did, healed_s=time.monotonic() - t0, exact=exact, consistent=consistent)
    assert not problems, problems


def test_broker_down_through_a_rollback_to_a_running_standby(control_bed, fault_row):
    """v1 a running standby of v2; the broker down. `kappa rollback` is refused at once in one line (the lag
    unknown because the broker is unreachable, --force flips anyway), moving nothing and leaving v1's job
    alone; `--force` with a reason flips at once, audited as forced. Once the broker is back the served
    table, the alias, the pointer and the states are v1's, and v1's job was never stopped."""
    from orchestrator.jobctl import inspect_version as inspect
    from tests.faults.fault_helpers import flips, one_line_error, oracle, serving_v1_then_v2_ready
    from tests.unit.control.control_helpers import ALIAS, PIPELINE as CONTROL

    bed = control_bed
    serving_v1_then_v2_ready(bed, v2_serves=True)
    standby = inspect(bed.k.version(CONTROL, 1))
    assert standby.alive and str(bed.k.registry.get_version(CONTROL, 1).state) == "standby"
    before = len(flips(bed))
    bed.fake_log.down = True
    t0 = time.monotonic()
    first = bed.run("rollback", CONTROL, "--actor", "fault-test", "--reason", "v2 is bad, the broker is down")
    assert first.exit_code != 0, f"a rollback with the broker down flipped without --force: {first.output}"
    line = one_line_error(first, "refused (v2 still serves)", "unknown because the Kafka broker is unreachable",
                          "--force")
    print(f"\nrollback, broker down: {line}")
    alias = bed.k.registry.get_alias(ALIAS)
    assert (alias.version, alias.published_version, len(flips(bed))) == (2, 2, before)
    forced = bed.run("rollback", CONTROL, "--force", "--actor", "fault-test", "--reason",
                     "v2 is bad: roll back now, broker or not")
    assert forced.exit_code == 0, forced.output
    flip = bed.k.registry.audit_log(CONTROL, action="rollback")[-1]
    assert (flip.outcome, flip.details["forced"], flip.details["readiness"]["lag"]) == ("ok", ["ready"], None)
    bed.fake_log.down = False
    rec = bed.run("reconcile", "--actor", "fault-test")
    assert rec.exit_code == 0, rec.output
    exact, consistent, problems = oracle(bed, 1)
    moved = flips(bed)[before:]
    if [(e.details or {}).get("to_version") for e in moved] != [1]:
        consistent = False
        problems.append(f"the alias moved {len(moved)} times: {[(e.details or {}) for e in moved]}")
    if bed.k.registry.audit_log(CONTROL, action="stop", version=1) or inspect(bed.k.version(CONTROL, 1)).pid != standby.pid:
        consistent = False
        problems.append("the rollback stopped or replaced the standby's job")
    fault_row(scenario=SCENARIO, phase="rollback",
              fault="broker down (lag reads fail) through `kappa rollback` to a running standby; fake log",
              kappa="refused at once in one line (lag unknown: broker unreachable; --force flips anyway), alias "
                    "unchanged; `--force` flipped at once, audited as forced; the standby's job untouched",
              healed_s=time.monotonic() - t0, exact=exact, consistent=consistent)
    assert not problems, problems

