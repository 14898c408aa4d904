"""The world of the control-plane model and stress tests: a pipeline, its registry, fake jobs and broker.

One pipeline on a real registry (SQLite or PostgreSQL) and a real kappa home; its jobs are fake
job processes (model_job.py, which creates the version's table and checkpoint and becomes
fake_job.py); the broker is a fake log whose `down` flag is an outage. Verbs are called through
their public functions only, so the checks keep working while the verbs' insides change.

`World.step` runs one verb, optionally crashing kappa at the n-th crash point it reaches
(`crashpoints.arm_nth`) or running a second verb there (a race, through a second registry
connection). It snapshots the registry and the files before, after, and at every crash point
(a hook on every crash point named in the product's source or seen reached), and checks the
invariants of model_checks.py on them: every moment, every step, and after each reconcile.

With `auto_rollback`, a promote also starts the watch of the promoted version (issue 21), which
every monitor pass runs; `degrade` makes the serving version's job report a failure that
supervision gives up at once, which the watch turns into an automatic rollback. The watch's
rollback runs with the short deadlines of the model's own rollback verb.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import psutil

from control_helpers import FAKE_JOB, FakeLog, end_children, make_spec, profiles, write_table
from model_checks import (IGNORED, IllegalState, Snap, UnexpectedError, Violation, check_reconciled, check_step,
                          check_trace, check_watch)
from orchestrator.core import crashpoints
from orchestrator.core.crashpoints import KappaCrashed
from orchestrator.core.files import read_json
from orchestrator.core.exceptions import BrokerError, KappaError
from orchestrator.context import Kappa
from orchestrator.core.settings import Settings
from orchestrator.jobctl import launch, stop_version
from orchestrator.jobctl.health import CHILDREN
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.monitor import monitor
from orchestrator.lifecycle.promote import promote
from orchestrator.lifecycle.reconcile import reconcile
from orchestrator.lifecycle import rollback as rollback_mod, watch as watch_mod
from orchestrator.lifecycle.retire import apply_retention, retire
from orchestrator.lifecycle.rollback import finish_rollback, prepare_rollback
from orchestrator.observe import lag as lag_mod
from orchestrator.registry import Registry

MODEL_JOB = Path(__file__).with_name("model_job.py")
ROOT = Path(__file__).resolve().parents[3]
ROWS = [("m1", "swe", "SWE", "Ada", 1), ("m2", "pm", "PM", "Grace", 2)]

#: Crash points named in the product's source (those with a computed name are hooked once seen).
KNOWN_POINTS: set[str] = {m for p in (ROOT / "orchestrator").rglob("*.py")
                          for m in re.findall(r"crashpoint\(\s*[\"']([^\"']+)[\"']", p.read_text())}
#: ... and those of the flip (`crashpoint(f"{action}.checked")`), of a promote and of a rollback
#: (the watch's automatic rollback among them).
KNOWN_POINTS |= {f"{verb}.{point}" for verb in ("promote", "rollback") for point in ("checked", "flipped", "published")}
#: What a degraded job reports before it exits: a deterministic failure, given up without a restart.
DEGRADED = "RulesError: the model degraded this version"
#: What the runs of this process explored: steps, crashes, races, crash points reached.
STATS: Counter = Counter()
POINTS: set[str] = set()


@dataclass
class Outcome:
    verb: str
    outcome: str                     # ok | refused | crashed
    result: Any = None
    error: str | None = None
    raced: str | None = None         # the verb that ran at a crash point of this one
    violations: list[Violation] = field(default_factory=list)


class _Future:
    def __init__(self, value: Any = None, error: Exception | None = None):
        self.value, self.error = value, error

    def result(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class FakeAdmin:
    """The two Kafka admin calls of deploy and retire, failing while the fake broker is down."""

    def __init__(self, log: FakeLog):
        self.log = log

    def _err(self) -> Exception | None:
        return Exception("KafkaError{code=_TRANSPORT,val=-195}") if self.log.down else None

    def describe_configs(self, resources, request_timeout=None):
        return {r: _Future({"cleanup.policy": SimpleNamespace(value="compact")}, self._err()) for r in resources}

    def delete_consumer_groups(self, groups, request_timeout=None):
        return {g: _Future(None, self._err()) for g in groups}


class SharedLog(FakeLog):
    """A fake log whose outage is a flag file, so that several processes see the same broker."""

    def __init__(self, ends: dict[int, int], flag: Path):
        self.flag, self._made = flag, False
        super().__init__(ends)  # its `down = False` must not end an outage another process began
        self._made = True

    @property
    def down(self) -> bool:
        return self.flag.exists()

    @down.setter
    def down(self, value: bool) -> None:
        if self._made:
            self.flag.touch() if value else self.flag.unlink(missing_ok=True)


class World:
    """One pipeline, its registry, its kappa home, its fake broker and jobs; `step` runs a verb and checks."""

    def __init__(self, home: Path, url: str, pipeline: str, *, actor: str = "model", busy_timeout: float = 30.0,
                 shared_outage: bool = False, auto_rollback: bool = False, grace_period_seconds: float = 0.0,
                 start_delay: float = 0.0):
        self.home, self.url, self.pipeline, self.actor = home, url, pipeline, actor
        self.start_delay = start_delay        # seconds a job takes to start (a loaded machine's)
        self.spec = make_spec(name=pipeline, alias=f"{pipeline}_live", catchup_samples=2,
                              grace_period_seconds=grace_period_seconds, keep_versions=2, key_count_tolerance=1.0,
                              max_reject_rate=1.0, auto_rollback=auto_rollback)
        self.settings = Settings(home=home, bootstrap_servers="127.0.0.1:9")
        self.k = self._kappa(busy_timeout)
        self.k2: Kappa | None = None          # the other process of a race, made when first needed
        self.template = home / "_template_table"
        if not (self.template / "_delta_log").exists():
            write_table(self.template, profiles(ROWS))
        log_cls = (lambda ends: SharedLog(ends, home / "broker_down")) if shared_outage else FakeLog
        self.log = log_cls({0: 100, 1: 50})
        self.next_behaviour = "normal"
        self.had_table: set[int] = set()
        self.had_checkpoint: set[int] = set()
        self.last: Snap | None = None
        self._trace: list[Snap] = []
        self._hook_violations: list[Violation] = []
        self._race_threads: list[threading.Thread] = []
        self._points_seen = 0
        self._raced: str | None = None
        self._lock = threading.Lock()
        self._pending: tuple[str, int, Any] | None = None
        self._main_thread: int | None = None
        self.watch_passes: list[list[dict]] = []   # the actions of each watch pass the step's verb completed

    def _kappa(self, busy_timeout: float) -> Kappa:
        return Kappa(self.settings, registry=Registry(self.url, busy_timeout=busy_timeout),
                     pipelines={self.pipeline: self.spec})

    # -- fakes ------------------------------------------------------------------------------------
    def install(self, mp) -> "World":
        """Fake broker (offsets, group offsets, topic configs, group deletion) and fake jobs, through `mp`
        (a MonkeyPatch)."""
        self.log.install(mp)
        log = self.log

        def checkpoint_next_offsets(path):  # a version whose job made its checkpoint has read the whole log
            return (dict(log.ends), 7) if Path(path).exists() else (None, None)

        def topic_partitions(k, topics, timeout=10.0):
            if log.down:
                raise BrokerError("cannot list topics: the Kafka broker at 127.0.0.1:9 is unreachable")
            return {t: sorted(p for tt, p in log.ends if tt == t) for t in topics}

        def job_command(v, **_):
            paths = v.paths
            return ([sys.executable, str(MODEL_JOB), "--table", str(paths.table), "--checkpoint",
                     str(paths.checkpoint), "--template", str(self.template), "--start-delay", str(self.start_delay),
                     "--", sys.executable, str(FAKE_JOB),
                     "--run-dir", str(paths.run_dir), "--behaviour", self.next_behaviour], "local")

        def group_offsets(k, group_id, topics, timeout=10.0):  # the group's offsets add nothing here
            if log.down:
                raise BrokerError("cannot read the committed offsets: the Kafka broker at 127.0.0.1:9 is unreachable")
            return {}

        real_rollback, real_pass = rollback_mod.rollback, watch_mod.watch_pass

        def quick_rollback(k, pipeline, to_version=None, **kw):   # the watch's: as short as the model's own
            return real_rollback(k, pipeline, to_version, **{"deadline_seconds": 1.5, "poll_seconds": 0.05, **kw})

        def watch_pass(k, pipeline, **kw):   # the passes that completed in the step's own verb are checked
            actions = real_pass(k, pipeline, **kw)
            if threading.get_ident() == self._main_thread:
                self.watch_passes.append(actions)
            return actions

        real_spawn = launch._spawn

        def spawn(v, rec, **kw):   # only a crashing job is waited on for its exit (0.5 s per start otherwise)
            if self.next_behaviour != "crash":
                kw["check_exit_seconds"] = 0
            return real_spawn(v, rec, **kw)

        admin = FakeAdmin(log)
        mp.setattr(launch, "_spawn", spawn)
        mp.setattr(rollback_mod, "rollback", quick_rollback)
        mp.setattr(watch_mod, "watch_pass", watch_pass)
        mp.setattr(lag_mod, "checkpoint_next_offsets", checkpoint_next_offsets)
        mp.setattr(lag_mod, "group_offsets", group_offsets)
        mp.setattr(lag_mod, "topic_partitions", topic_partitions)
        mp.setattr(launch, "job_command", job_command)
        mp.setattr(Kappa, "admin", lambda self: admin)
        return self

    # -- observing ----------------------------------------------------------------------------------
    def jobs(self, versions: int | None = None) -> dict[int, list[int]]:
        """{version: pids} of the live job processes of this pipeline, found by their command line."""
        last = versions if versions is not None else max(self.last.states, default=0) if self.last else 0
        runs = {str(self.k.paths(self.pipeline, v).run_dir): v for v in range(1, last + 8)}
        out: dict[int, list[int]] = {}
        for p in psutil.process_iter(["pid", "cmdline", "status"]):
            cmd = p.info["cmdline"] or []
            if p.info["status"] == psutil.STATUS_ZOMBIE or "--run-dir" not in cmd or str(FAKE_JOB) not in cmd:
                continue
            v = runs.get(cmd[cmd.index("--run-dir") + 1])
            if v is not None:
                out.setdefault(v, []).append(p.info["pid"])
        return out

    def snapshot(self, where: str = "") -> Snap:
        """The registry and the files now. Read in an order that a concurrent verb cannot make look
        wrong: the audit watermark first, then the files (a table is deleted only after its
        version left the states that protect it), then the versions, then the alias."""
        reg, p = self.k.registry, self.pipeline
        audit = reg.audit_log(p, limit=1)
        top = max(self.last.states, default=0) + 8 if self.last else 8
        paths = {v: self.k.paths(p, v) for v in range(1, top)}
        tables = {v for v, ps in paths.items() if (Path(ps.table) / "_delta_log").exists()}
        checkpoints = {v for v, ps in paths.items() if Path(ps.checkpoint).exists()}
        try:
            recs = reg.list_versions(p)
        except Exception as e:  # a state the records do not know fails their validation
            raise IllegalState(f"{where}: the registry holds a version state that is not a VersionState: {e}")
        a = reg.get_alias(self.spec.alias)
        watches = {r.version: ws for r in recs if isinstance(ws := (r.details or {}).get("watch"), dict)}
        return Snap(states={r.version: str(getattr(r.state, "value", r.state)) for r in recs},
                    alias=None if a is None else (a.version, a.previous_version, a.published_version),
                    tables=tables, checkpoints=checkpoints, audit_id=audit[-1].id if audit else 0, where=where,
                    in_flight=frozenset(r.version for r in recs if r.in_flight),
                    watches={v: (str(ws.get("state")), bool(ws.get("settled"))) for v, ws in watches.items()})

    def _hook(self, name: str) -> Callable[[], None]:
        def at_point() -> None:
            try:
                snap = self.snapshot(f"at crash point {name}")
            except Violation as e:
                with self._lock:
                    self._hook_violations.append(e)
                return
            with self._lock:
                self._trace.append(snap)
                self._points_seen += 1
                race = self._pending if self._pending and self._pending[0] == "race" else None
                go = race is not None and self._points_seen == race[1]
                if go:
                    self._pending = None
            if go:
                self._race(race[2], name)
        return at_point

    def _race(self, verb: tuple[str, dict], point: str) -> None:
        """Run `verb` through another registry connection while this verb waits at `point`."""
        STATS["races"] += 1
        self._raced = verb[0]
        if self.k2 is None:
            self.k2 = self._kappa(busy_timeout=2.0)
        k2, (name, args) = self.k2, verb
        if name == "kill":  # the job dies right there
            self.kill_job(args.get("v") or 1)
            return
        if name == "degrade":  # the serving version's job fails right there
            self.degrade()
            return

        def run() -> None:
            try:
                self.verb(name, actor=f"{self.actor}-other", **args)(k2)
            except (KappaError, KappaCrashed):
                pass
            except Exception as e:  # noqa: BLE001 - reported as a violation of the step
                with self._lock:
                    self._hook_violations.append(UnexpectedError(
                        f"{name}{args} racing at {point} raised {type(e).__name__}: {e}"))
        t = threading.Thread(target=run, name=f"race-{name}", daemon=True)
        t.start()
        t.join(30)  # a verb blocked on this one's lock runs on after this one goes on
        self._race_threads.append(t)

    # -- verbs ---------------------------------------------------------------------------------------
    def verb(self, name: str, *, actor: str | None = None, v: int | None = None, flag: bool = False,
             plan: Any = None, deadline: float = 1.0) -> Callable[[Kappa], Any]:
        """The public call of one verb, as a function of the Kappa it runs with (`deadline`: of a ready's wait)."""
        p, who, why = self.pipeline, actor or self.actor, f"model: {name}"
        return {
            "deploy": lambda k: deploy(k, k.pipeline(p), actor=who, reason=why, queue=flag),
            "ready": lambda k: wait_ready(k.version(p, v), deadline_seconds=deadline, poll_seconds=0.05, actor=who),
            "promote": lambda k: promote(k.version(p, v), actor=who, reason=f"{why} --force" if flag else why, force=flag),
            "rollback": lambda k: finish_rollback(k, prepare_rollback(k, k.pipeline(p), v, actor=who, reason=why), actor=who,
                                                  reason=why, deadline_seconds=1.5, poll_seconds=0.05),
            "prepare_rollback": lambda k: prepare_rollback(k, k.pipeline(p), v, actor=who, reason=why),
            "finish_rollback": lambda k: finish_rollback(k, plan, actor=who, reason=why, deadline_seconds=1.5,
                                                         poll_seconds=0.05),
            "stop": lambda k: stop_version(k.version(p, v), actor=who, reason=why, force=flag, graceful_timeout=5,
                                           term_timeout=5),
            "retire": lambda k: retire(k.version(p, v), actor=who, reason=why),
            "retention": lambda k: apply_retention(k, k.pipeline(p), actor=who, dry_run=False, keep=v),
            "reconcile": lambda k: reconcile(k, actor=who, specs=[k.pipeline(p)]),
            "monitor": lambda k: monitor(k, actor=who, pipelines=[p]),
        }[name]

    def crash_next(self, n: int) -> None:
        """Kappa dies at the n-th crash point the next verb reaches (it completes if it reaches fewer)."""
        self._pending = ("crash", n, None)

    def race_next(self, n: int, verb: str, **args: Any) -> None:
        """At the n-th crash point the next verb reaches, `verb` runs (another process, in effect)."""
        self._pending = ("race", n, (verb, args))

    def forget_pending(self) -> None:
        self._pending = None

    def expire_leases(self) -> None:
        """Let the leases of verbs that crashed run out, as their time-to-live does: until then reconcile
        leaves such a version to its (dead) holder, so a stop cut off after marking it stopped while a
        crashed start held its lease keeps its job running for that long."""
        reg = self.k.registry
        for rec in reg.list_versions(self.pipeline):
            if rec.lease_held():
                reg.take_lease(self.pipeline, rec.version, owner=rec.lease_owner, expected=(rec.state,), ttl=-1)

    def execute(self, name: str, *, hooks: bool = True, **args: Any) -> Outcome:
        """Run one verb with the pending crash or race armed; its outcome, unchecked.

        With `hooks`, every crash point snapshots the world into the step's trace."""
        self._hook_violations, self._race_threads, self._points_seen, self._raced = [], [], 0, None
        self._main_thread, self.watch_passes = threading.get_ident(), []
        crashpoints.disarm()
        crashpoints.record(True)
        if hooks:
            for point in KNOWN_POINTS | POINTS:
                crashpoints.hook(point, self._hook(point))
        pending, self._pending = self._pending, None
        if pending and pending[0] == "crash":
            crashpoints.arm_nth(pending[1])
        elif pending:
            self._pending = pending
        out = Outcome(verb=name, outcome="ok")
        try:
            out.result = self.verb(name, **args)(self.k)
        except KappaCrashed as e:
            out.outcome, out.error = "crashed", str(e)
        except KappaError as e:
            out.outcome, out.error = "refused", f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - anything else is a bug of the verb
            out.outcome, out.error = "error", f"{type(e).__name__}: {e}"
            out.violations.append(UnexpectedError(f"{name}{args} raised {type(e).__name__}: {e}"))
        finally:
            reached = crashpoints.reached()
            crashpoints.disarm()
            self._pending = None
            for t in self._race_threads:
                t.join(60)
        POINTS.update(reached)
        STATS["steps"] += 1
        STATS[f"outcome:{out.outcome}"] += 1
        STATS[f"{name}:{out.outcome}"] += 1
        if out.error:
            STATS[f"why:{name}:{re.sub(self.pipeline, 'P', out.error)[:70]}"] += 1
        STATS["points_reached"] += len(reached)
        out.violations += self._hook_violations
        out.raced = self._raced
        return out

    def step(self, name: str, *, raise_first: bool = True, **args: Any) -> Outcome:
        """Run one verb; check every invariant on every snapshot taken; raise the first violation
        (or, without `raise_first`, return them all in the outcome)."""
        before = self.last or self.snapshot("start")
        self._trace = [before]
        out = self.execute(name, **args)
        after = self.snapshot("end")
        self._trace.append(after)
        out.violations += check_trace(self, self._trace)
        out.violations += check_step(self, name, args, out, self._trace)
        if name == "reconcile" and out.outcome == "ok":
            out.violations += check_reconciled(self, after)
        out.violations += check_watch(self, name, out, self._trace, self.watch_passes)
        for a in (a for actions in self.watch_passes for a in actions):
            STATS[f"watch:{a.get('kind')}"] += 1
            if a.get("error"):
                STATS[f"why:watch:{a['kind']}:{re.sub(self.pipeline, 'P', a['error'])[:90]}"] += 1
        self.last = after
        out.violations = [v for v in out.violations if type(v).__name__ not in IGNORED]
        if out.violations and raise_first:
            raise out.violations[0]
        return out

    # -- world events ----------------------------------------------------------------------------------
    def kill_job(self, v: int) -> bool:
        """kill -9 the job of v (if one runs); True if one was killed."""
        pids = self.jobs().get(v, [])
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            child = CHILDREN.get(pid)
            if child is not None:
                child.wait(10)
            else:
                psutil.wait_procs([psutil.Process(pid)], timeout=10) if psutil.pid_exists(pid) else None
        return bool(pids)

    def degrade(self) -> int | None:
        """The serving version degrades: its job reports a deterministic failure and exits, which
        supervision gives up at once (no restart would help); the version it was, or None."""
        a = self.k.registry.get_alias(self.spec.alias)
        if a is None:
            return None
        self.kill_job(a.version)
        path = Path(self.k.paths(self.pipeline, a.version).status_file)
        if path.parent.exists():
            status = {**(read_json(path) or {}), "state": "failed", "error": DEGRADED, "heartbeat_at": time.time()}
            tmp = path.with_name(f".{path.name}.model")
            tmp.write_text(json.dumps(status))
            os.replace(tmp, path)
        return a.version

    def truncate_pointer(self) -> bool:
        """Cut the alias's pointer file in half (a torn write by something else); True if there was one."""
        path = Path(self.k.alias_file(self.spec.alias))
        if not path.exists():
            return False
        text = path.read_text()
        path.write_text(text[: len(text) // 2])
        return True

    def close(self) -> None:
        crashpoints.disarm()
        for pids in self.jobs(versions=64).values():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        end_children()
        for k in (self.k, self.k2):
            if k is not None:
                k.registry.close()
