"""Fault suite (issue 33), scenario 1: the link between the jobs and the broker, through Toxiproxy.

One embedded Apache Kafka node for this module advertises a Toxiproxy proxy's address
(`EmbeddedBroker(advertised_port=...)`), so every connection of every client (the jobs' Spark Kafka
source, kappa's lag readings, the test's producer and oracle) goes through the proxy after its
bootstrap request; the controller listener stays direct. One serving version's job (the live tail)
runs throughout, and each fault also meets a new version's backfill: the fault is injected right
after its deploy, before its first micro-batch committed (checked). The jobs give up on a broker
they cannot reach after `OUTAGE` s (`brokerOutageSeconds`), so a long fault kills them and the
supervisor's pass (`monitor`, what `kappa supervise` runs) restarts them from their checkpoints.

- cut: Toxiproxy's `timeout` toxic with timeout=0 on both streams: no byte passes and no connection
  closes. While it lasts the lag of both versions reads unknown (never 0) and a promote is refused
  with one line; the jobs die and are restarted after the heal. A second cut meets a rollback to the
  running standby: refused at its first lag sample, done after the heal.
- slow: `latency` with jitter on both streams, while a backfill runs, updates arrive, a promote and a
  rollback flip the alias: everything goes through, slower.
- reset: `reset_peer` on the broker-to-client stream: each response resets its connection (a fetch
  in flight is cut), during a backfill and the live tail, then during a promote and a rollback: each
  refused with one line (its lag cannot be read), moving nothing, and done once the resets stop.

After each heal: the served table and the new version's table equal the oracle's for the log as it
is then (tests/served.py), the registry holds one live job per version, the states the model allows,
and every restart audited.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from orchestrator.context import Kappa
from orchestrator.core.exceptions import KappaError
from orchestrator.core.net import free_port
from orchestrator.core.settings import Settings
from orchestrator.dev import datagen
from orchestrator.dev.broker import EmbeddedBroker
from orchestrator.jobctl import inspect_version, stop_version
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.monitor import monitor
from orchestrator.lifecycle.promote import promote
from orchestrator.lifecycle.rollback import rollback
from orchestrator.observe.lag import measure_lag
from orchestrator.registry import Registry
from tests.faults.netfaults import Toxiproxy
from tests.integration.control.control_live import DEADLINE, PARTITIONS, PIPELINE, Live, make_spec, \
    served_equals_expected
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.faults]

INITIAL = 1500
KEYS = 400
#: The jobs' brokerOutageSeconds: a cut longer than this kills them.
OUTAGE = 10
PROXY = "kafka"
DONE = {"promote": "promoted", "rollback": "rolled back"}
#: How long the reset toxic stays (under OUTAGE: a job may ride it out, or die and be restarted).
RESET_SECONDS = 8.0


class Net:
    def __init__(self, toxi: Toxiproxy, broker: EmbeddedBroker, live: Live):
        self.toxi, self.broker, self.live = toxi, broker, live

    @property
    def k(self) -> Kappa:
        return self.live.k

    def v(self, n: int):
        return self.k.version(PIPELINE, n)

    def serving(self) -> int:
        return self.k.registry.get_alias(self.live.alias).version


@pytest.fixture(scope="module")
def net(tmp_path_factory, module_seed):
    d = tmp_path_factory.mktemp("netfaults")
    toxi = Toxiproxy(d / "toxiproxy.log").start()
    broker = reg = lv = None
    try:
        broker_port = free_port()
        proxy_port = toxi.proxy(PROXY, broker_port)
        broker = EmbeddedBroker(d / "broker", port=broker_port, advertised_port=proxy_port).start()
        bootstrap = f"127.0.0.1:{proxy_port}"
        unique = uuid.uuid4().hex[:8]
        topic, alias = f"profiles_{unique}", f"profiles_std_{unique}"
        datagen.ensure_topic(bootstrap, topic, PARTITIONS)
        home = d / "home"
        home.mkdir()
        reg = Registry(f"sqlite:///{home / 'registry.db'}")
        spec = make_spec(topic, alias, restart_backoff_seconds=1.0, max_restarts=20,
                         options={"source_options": {"brokerOutageSeconds": str(OUTAGE)}})
        k = Kappa(Settings(home=home, bootstrap_servers=bootstrap), registry=reg, pipelines={PIPELINE: spec})
        lv = Live(bootstrap, topic, alias, home, k, seed=module_seed)
        lv.produce(INITIAL, KEYS, first_new=True)
        info = deploy(k, k.pipeline(PIPELINE), "v1", actor="setup", reason="v1 serves for the network faults")
        assert wait_ready(k.version(PIPELINE, info.version), deadline_seconds=DEADLINE, poll_seconds=1).ready
        promote(k.version(PIPELINE, info.version), actor="setup", reason="v1 serves")
        yield Net(toxi, broker, lv)
    finally:
        if lv is not None:
            lv.close()
        if reg is not None:
            reg.close()
        if broker is not None:
            broker.stop()
        toxi.stop()


def committed_batches(net: Net, n: int) -> list[str]:
    return sorted(p.name for p in (Path(str(net.k.paths(PIPELINE, n).checkpoint)) / "commits").glob("[0-9]*"))


def supervised_until_running(net: Net, versions: list[int], what: str) -> list[dict]:
    """Monitor passes (reconcile restarts dead jobs) until every version's job runs; the actions taken."""
    actions: list[dict] = []

    def running():
        report = monitor(net.k, actor="supervisor", raise_on_problem=False)
        actions.extend(a for a in report.reconciled if a.get("kind") not in (None, "publish"))
        health = {n: inspect_version(net.v(n)).health for n in versions}
        return health if all(h == "running" for h in health.values()) else None
    wait_until(running, what, DEADLINE, poll=1.0)
    return actions


def served_exactly(net: Net, what: str, version: int | None = None) -> None:
    """Wait for the table to equal the oracle's, with a supervision pass before each look, as `kappa
    supervise` runs beside the jobs: a job that dies after the fault healed (a connection reset it took a
    while to give up on) is restarted from its checkpoint, not waited for until the deadline."""
    def look():
        monitor(net.k, actor="supervisor", raise_on_problem=False)
        return served_equals_expected(net.live, "v1", version=version)

    wait_until(look, f"{what} to equal the oracle's table", DEADLINE, poll=1.0, done=lambda r: r[0])


def consistent(net: Net, running: list[int]) -> list[str]:
    """What is wrong with the registry (empty: consistent): the alias and its pointer agree, each running
    version has one live job whose PID the registry records, no give-up, every restart audited ok."""
    from orchestrator.serving import resolve_alias

    k, wrong = net.k, []
    alias = k.registry.get_alias(net.live.alias)
    pointer = resolve_alias(net.live.alias, k.settings)
    if pointer["version"] != alias.version:
        wrong.append(f"pointer at v{pointer['version']}, registry at v{alias.version}")
    for n in running:
        rec, st = k.registry.get_version(PIPELINE, n), inspect_version(net.v(n))
        if not st.alive or rec.pid != st.pid:
            wrong.append(f"v{n}: registry pid {rec.pid}, job {st.describe()}")
        if rec.state not in ("serving", "caught_up", "backfilling", "standby"):
            wrong.append(f"v{n} is {rec.state}")
        if rec.lease_held():
            wrong.append(f"v{n}'s lease is still held by {rec.lease_owner}")
        bad = [e for e in k.registry.audit_log(PIPELINE, limit=None, version=n, action="restart") if e.outcome != "ok"]
        if bad:
            wrong.append(f"v{n}: restarts not ok: {[(e.outcome, e.reason) for e in bad]}")
    return wrong


def restarts(net: Net, n: int, since: float) -> int:
    return sum(1 for e in net.k.registry.audit_log(PIPELINE, limit=None, version=n, action="restart") if e.at >= since)


def test_a_cut_link_reads_unknown_refuses_a_promote_and_heals_to_exact_tables(net, fault_row):
    k, toxi = net.k, net.toxi
    live_v = net.serving()
    t_wall = time.time()
    info = deploy(k, k.pipeline(PIPELINE), "v1", actor="tests", reason="a backfill meets a cut link")
    new_v = info.version
    toxi.add(PROXY, "cut", "timeout", {"timeout": 0})
    assert committed_batches(net, new_v) == [], "the cut came after the backfill's first commit"

    # While the link is cut: lag unknown, never 0; a promote refused with one line.
    for n in (live_v, new_v):
        r = measure_lag(net.v(n), timeout=3)
        assert r.total is None and r.error, f"v{n}'s lag while the broker cannot be reached: {r}"
    with pytest.raises(KappaError) as refused:
        promote(net.v(new_v), actor="tests", reason="a promote during the cut")
    msg = str(refused.value)
    print(f"\npromote during the cut: {msg}")
    assert "\n" not in msg and f"v{new_v}" in msg, msg
    assert net.serving() == live_v
    wait_until(lambda: inspect_version(net.v(new_v)).failed, "the backfill's job to give up on the cut link",
               OUTAGE * 12, poll=1.0)
    live_died = inspect_version(net.v(live_v)).failed

    toxi.remove(PROXY, "cut")
    healed = time.monotonic()
    actions = supervised_until_running(net, [live_v, new_v], "both jobs to run again after the cut")
    net.live.produce(200, KEYS)                    # a live update after the heal must appear
    served_exactly(net, "the served table after the cut")
    live_s = time.monotonic() - healed
    assert wait_ready(net.v(new_v), deadline_seconds=DEADLINE, poll_seconds=1).ready
    served_exactly(net, f"v{new_v}'s table after the cut", version=new_v)
    backfill_s = time.monotonic() - healed
    wrong = consistent(net, [live_v, new_v])
    assert wrong == [], wrong
    assert restarts(net, new_v, t_wall) >= 1, actions
    kinds = sorted({a["kind"] for a in actions})
    fault_row(scenario="link cut", phase="live", fault=f"timeout toxic (no packets) until v{new_v} died",
               kappa=f"lag unknown; job {'died, restarted by supervision' if live_died else 'rode it out'}",
               healed_s=live_s, exact=True, consistent=True)
    fault_row(scenario="link cut", phase="backfill", fault="timeout toxic before the first batch",
               kappa=f"lag unknown; job died, restarted ({', '.join(kinds)})", healed_s=backfill_s, exact=True,
               consistent=True)

    # The promote refused during the cut goes through after the heal; the old version stands by.
    promote(net.v(new_v), actor="tests", reason="after the cut healed")
    served_exactly(net, f"the served table after v{new_v}'s promote")
    fault_row(scenario="link cut", phase="promote", fault="promote during the cut",
               kappa="refused with one line (lag unknown); promoted after the heal", healed_s=0.0, exact=True,
               consistent=consistent(net, [new_v, live_v]) == [])

    # A rollback to the running standby during a second cut: refused at its first lag sample in one line,
    # nothing moved; done once the link heals.
    t0 = time.monotonic()
    retried, healed = refused_then_done(net, "rollback", live_v, "during the cut",
                                        ("cut", "timeout", {"timeout": 0}, None))
    settle(net, healed, [live_v, new_v])
    wrong = consistent(net, [live_v, new_v])
    assert wrong == [], wrong
    fault_row(scenario="link cut", phase="rollback", fault="rollback to the running standby during a cut",
              kappa="refused at its first lag sample with one line (lag unknown); rolled back after the heal"
                    + (f" ({len(retried)} retries: {retried[0]})" if retried else ""),
              healed_s=time.monotonic() - t0, exact=True, consistent=True)
    stop_version(net.v(new_v), actor="tests", reason="spare the cores: the next scenario needs two versions")


def test_a_slow_link_delays_but_a_backfill_updates_a_promote_and_a_rollback_go_through(net, fault_row):
    k, toxi = net.k, net.toxi
    live_v = net.serving()
    t_wall = time.time()
    toxi.add(PROXY, "slow", "latency", {"latency": 120, "jitter": 60})
    t0 = time.monotonic()
    info = deploy(k, k.pipeline(PIPELINE), "v1", actor="tests", reason="a backfill over a slow link")
    new_v = info.version
    net.live.produce(200, KEYS)
    served_exactly(net, "the served table over the slow link")
    live_s = time.monotonic() - t0
    assert wait_ready(net.v(new_v), deadline_seconds=DEADLINE, poll_seconds=1).ready
    served_exactly(net, f"v{new_v}'s table over the slow link", version=new_v)
    backfill_s = time.monotonic() - t0

    t1 = time.monotonic()
    promote(net.v(new_v), actor="tests", reason="a promote over a slow link")
    served_exactly(net, f"the served table after v{new_v}'s promote over the slow link")
    promote_s = time.monotonic() - t1
    t2 = time.monotonic()
    res = rollback(k, k.pipeline(PIPELINE), live_v, actor="tests", reason="a rollback over a slow link")
    print(f"\nrollback over the slow link: {res.message}")
    assert net.serving() == live_v
    net.live.produce(100, KEYS)
    served_exactly(net, "the served table after the rollback over the slow link")
    rollback_s = time.monotonic() - t2
    assert toxi.toxics(PROXY), "the latency toxic was gone before the end of the scenario"
    toxi.remove(PROXY, "slow")
    wrong = consistent(net, [live_v, new_v])
    assert wrong == [], wrong
    for n in (live_v, new_v):
        assert restarts(net, n, t_wall) == 0, f"v{n} was restarted over the slow link"
    for phase, secs, what in (("live", live_s, "updates served"), ("backfill", backfill_s, "caught up"),
                              ("promote", promote_s, "promoted"), ("rollback", rollback_s, "rolled back")):
        fault_row(scenario="link slowed", phase=phase, fault="latency 120 ms, jitter 60 ms both ways",
                   kappa=f"{what} through it, no restart", healed_s=secs, exact=True, consistent=True)
    stop_version(net.v(new_v), actor="tests", reason="spare the cores for the next scenario")


def test_a_link_reset_mid_fetch_is_ridden_out_or_supervised_to_exact_tables(net, fault_row):
    k, toxi = net.k, net.toxi
    live_v = net.serving()
    t_wall = time.time()
    net.live.produce(200, KEYS)                  # the live job fetches these while the resets come
    info = deploy(k, k.pipeline(PIPELINE), "v1", actor="tests", reason="a backfill meets connection resets")
    new_v = info.version
    toxi.add(PROXY, "reset", "reset_peer", {"timeout": 0}, streams=("downstream",))
    assert committed_batches(net, new_v) == [], "the resets came after the backfill's first commit"
    r = measure_lag(net.v(new_v), timeout=3)      # unknown, or the whole log: never 0 before its first commit
    assert r.total != 0, f"v{new_v}'s lag read 0 while every response is reset: {r}"
    time.sleep(RESET_SECONDS)          # the fault's length is what is being tested: connections reset meanwhile
    toxi.remove(PROXY, "reset")
    healed = time.monotonic()
    actions = supervised_until_running(net, [live_v, new_v], "both jobs to run after the resets")
    served_exactly(net, "the served table after the resets")
    live_s = time.monotonic() - healed
    assert wait_ready(net.v(new_v), deadline_seconds=DEADLINE, poll_seconds=1).ready
    served_exactly(net, f"v{new_v}'s table after the resets", version=new_v)
    backfill_s = time.monotonic() - healed
    wrong = consistent(net, [live_v, new_v])
    assert wrong == [], wrong
    for phase, n, secs in (("live", live_v, live_s), ("backfill", new_v, backfill_s)):
        r = restarts(net, n, t_wall)
        fault_row(scenario="link reset", phase=phase, fault=f"reset_peer on every response for {RESET_SECONDS:g} s",
                   kappa=f"restarted by supervision ({r}x)" if r else "rode it out", healed_s=secs, exact=True,
                   consistent=True)
    print(f"\nsupervision after the resets: {sorted({a['kind'] for a in actions})}")

    # A promote, then a rollback, each while every response is reset: refused in one line (the lag cannot be
    # read), nothing moves; each goes through once the resets stop, and the served table follows it exactly.
    for verb, target, other in (("promote", new_v, live_v), ("rollback", live_v, new_v)):
        t0 = time.monotonic()
        retried, healed = refused_then_done(net, verb, target, "while every response is reset",
                                            ("reset", "reset_peer", {"timeout": 0}, ("downstream",)))
        healed_s = time.monotonic() - t0
        settle(net, healed, [target, other])
        wrong = consistent(net, [target, other])
        assert wrong == [], wrong
        fault_row(scenario="link reset", phase=verb, fault=f"reset_peer on every response during `{verb}`",
                   kappa=f"refused with one line (lag unknown); {DONE[verb]} to v{target} after the resets"
                         + (f" ({len(retried)} retries: {retried[0]})" if retried else ""),
                   healed_s=healed_s, exact=True, consistent=True)


def refused_then_done(net: Net, verb: str, target: int, during: str, toxic: tuple) -> tuple[list[str], float]:
    """`verb` to `target` while `toxic` (name, type, attributes, streams) is on the link: refused in one line
    (the lag cannot be read), the alias unmoved; then, the toxic removed, done (`flip_after_heal`) and the
    served table exact after a live update. The one-line errors met after the heal, and when it healed."""
    name, kind, attrs, streams = toxic
    before = net.serving()
    net.toxi.add(PROXY, name, kind, attrs, **({"streams": streams} if streams else {}))
    try:
        with pytest.raises(KappaError) as refused:
            flip_to(net, verb, target, f"a {verb} {during}")
    finally:
        net.toxi.remove(PROXY, name)
        healed = time.monotonic()
    msg = str(refused.value)
    print(f"\n{verb} {during}: {msg}")
    assert "\n" not in msg and f"v{target}" in msg and "unknown" in msg, msg
    assert net.serving() == before, f"the {verb} refused {during} moved the alias"
    retried = flip_after_heal(net, verb, target, f"the {verb} refused {during}, after the heal")
    assert net.serving() == target
    net.live.produce(100, KEYS)                    # a live update after the flip reaches the served table
    served_exactly(net, f"the served table after the {verb} to v{target}")
    return retried, healed


def flip_after_heal(net: Net, verb: str, target: int, reason: str) -> list[str]:
    """The verb once the fault healed, retried as its user would (issue 33: a verb fails with one line or
    completes on retry). A job the fault killed late (its Kafka source gives up on the broker seconds after
    the link is back) fails the verb in one line (`cannot become ready: the job reported failure`); the
    supervision pass before each attempt restarts it from its checkpoint. The one-line errors met."""
    errors: list[str] = []

    def attempt():
        monitor(net.k, actor="supervisor", raise_on_problem=False)
        try:
            flip_to(net, verb, target, reason)
            return True
        except KappaError as e:
            errors.append(str(e).splitlines()[0])        # (a failed job's error adds its log's last lines)
            print(f"\n{verb} after the heal, to be retried: {errors[-1]}")
            return None
    wait_until(attempt, f"the {verb} to v{target} after the fault healed", DEADLINE, poll=2.0)
    return errors


def settle(net: Net, healed: float, versions: list[int]) -> None:
    """A job the fault left near its outage bound gives up within OUTAGE s of the heal: that window passes
    under supervision (a pass a second), then every version's job runs, so that the oracle of the registry,
    and the next scenario, meet jobs no earlier fault can still kill."""
    while time.monotonic() < healed + OUTAGE + 2:
        monitor(net.k, actor="supervisor", raise_on_problem=False)
        time.sleep(1.0)
    supervised_until_running(net, versions, f"v{versions} to run once the fault's outage bound passed")


def flip_to(net: Net, verb: str, target: int, reason: str) -> None:
    if verb == "promote":
        promote(net.v(target), actor="tests", reason=reason)
    else:
        rollback(net.k, net.k.pipeline(PIPELINE), target, actor="tests", reason=reason)
