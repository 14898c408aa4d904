"""Stress: several OS processes run random verbs against one registry and one kappa home at once.

KAPPA_STRESS_WORKERS processes (default 4) each loop for KAPPA_STRESS_SECONDS (default 25):
deploy, await, promote, rollback (whole, or its two halves apart), stop, retire, retention,
reconcile, monitor, kill -9 of a job, a broker outage (a flag file every process's fake broker
reads), and, now and then, kappa's death at a random crash point of a verb: the worker process
exits there (os._exit), its jobs keep running, and a fresh worker takes its place. Jobs are
fake job processes (model_job.py), no Spark.

Meanwhile this process watches the registry and the files (`model_world.World.snapshot`, every
0.1 s): at most one version serving, the alias on an existing unretired version whose table
exists, only legal states and moves, no served, standby or rollback-target table or checkpoint
deleted, never two jobs for one version. At the end (broker back, one reconcile): the pointer
file agrees with the registry, the alias's version serves, no job runs outside a running
state, and the audit log explains every state change that was seen (an entry about the version
written after it was last seen in its previous state). A worker's unexpected exception (not a
KappaError) fails the test too. Run on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import faulthandler
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path[:0] = [str(HERE.parents[3]), str(HERE.parents[2] / "unit" / "control")]

import pytest  # noqa: E402

from model_checks import Snap, StrayJob, Unaudited, UnexpectedError, Violation, check_snap, concerns  # noqa: E402
from model_world import World  # noqa: E402

pytestmark = pytest.mark.integration

WORKERS = int(os.environ.get("KAPPA_STRESS_WORKERS", "4"))
SECONDS = float(os.environ.get("KAPPA_STRESS_SECONDS", "15"))
VERBS = ["deploy"] * 3 + ["ready"] * 4 + ["promote"] * 3 + ["rollback", "prepare_rollback", "finish_rollback",
         "stop", "retire", "retention", "reconcile", "monitor", "kill", "outage", "truncate"]


# -- a worker process ------------------------------------------------------------------------------

def worker(home: Path, url: str, pipeline: str, name: str, seed: int, until: float) -> None:
    """Random verbs until `until`; exits at once (code 70) when armed to crash and the crash comes."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the watcher asks for the stacks of a hung worker
    mp = pytest.MonkeyPatch()
    world = World(home, url, pipeline, actor=name, shared_outage=True).install(mp)
    rng = random.Random(seed)
    plans: list = []
    errors = home / f"errors-{name}.txt"
    while time.time() < until:
        verb = rng.choice(VERBS)
        versions = [r.version for r in world.k.registry.list_versions(pipeline)] or [1]
        v = rng.choice(versions)
        if verb == "kill":
            world.kill_job(v)
            continue
        if verb == "truncate":
            world.truncate_pointer()
            continue
        if verb == "outage":
            world.log.down = not world.log.down and rng.random() < 0.5
            continue
        args: dict = {}
        if verb == "finish_rollback":
            if not plans:
                continue
            args["plan"] = plans.pop(0)
        elif verb == "deploy":
            args["flag"] = rng.random() < 0.3
            world.next_behaviour = "crash" if rng.random() < 0.1 else "normal"
        elif verb == "stop":
            args.update(v=v, flag=rng.random() < 0.3)
        elif verb == "retention":
            args["v"] = rng.randint(1, 3)
        elif verb in ("ready", "retire") or (verb in ("promote", "rollback", "prepare_rollback") and rng.random() < 0.6):
            args["v"] = v
        if rng.random() < 0.12:
            world.crash_next(rng.randint(1, 6))
        t0 = time.monotonic()
        out = world.execute(verb, hooks=False, **args)
        world.next_behaviour = "normal"
        shown = {k: v for k, v in args.items() if k != "plan"}
        print(f"{time.time():.2f} {verb}{shown}: {out.outcome} in {time.monotonic() - t0:.2f} s"
              f"{': ' + out.error[:150] if out.error else ''}", flush=True)
        if out.outcome == "crashed":
            os._exit(70)  # kappa dies here: nothing after this point of the verb happens
        if verb == "prepare_rollback" and out.outcome == "ok":
            plans.append(out.result)
        for e in out.violations:
            with open(errors, "a") as f:
                f.write(" | ".join(line.strip() for line in str(e).splitlines() if line.strip())[:600] + "\n")
    world.k.registry.close()


# -- the test ---------------------------------------------------------------------------------------

def _spawn(home: Path, url: str, pipeline: str, name: str, seed: int, until: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parents[3]),
                                                                        os.environ.get("PYTHONPATH")]))}
    log = open(home.parent / f"{name}.log", "ab")
    return subprocess.Popen([sys.executable, str(HERE), json.dumps([str(home), url, pipeline, name, seed, until])],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _audit_explains(world: World, changes: list[tuple[int, str, int]]) -> list[Violation]:
    entries = world.k.registry.audit_log(world.pipeline, limit=None)
    found: list[Violation] = []
    for v, state, watermark in changes:
        if not any(e.id > watermark and concerns(e, v) for e in entries):
            found.append(Unaudited(f"v{v} was seen moving to {state}, but no audit entry about v{v} was written "
                                   f"after audit id {watermark}"))
    return found


def stress(tmp_path: Path, url: str, rng: random.Random) -> dict:
    home, pipeline = tmp_path / "home", "stress"
    mp = pytest.MonkeyPatch()
    world = World(home, url, pipeline, actor="observer", shared_outage=True).install(mp)
    until = time.time() + SECONDS
    procs = {f"w{i}": _spawn(home, url, pipeline, f"w{i}", rng.randrange(2**31), until) for i in range(WORKERS)}
    violations: list[Violation] = []
    changes: list[tuple[int, str, int]] = []     # (version, new state, audit watermark ~1 s before)
    marks: list[tuple[float, int]] = []          # (time, audit id) of each poll
    crashes = respawns = polls = 0
    prev = world.last = world.snapshot("start")
    last_scan = 0.0
    try:
        while time.time() < until or any(p.poll() is None for p in procs.values()):
            time.sleep(0.1)
            cur = world.snapshot(f"watching ({time.time() - until + SECONDS:.1f} s)")
            polls += 1
            marks.append((time.time(), cur.audit_id))
            old = [a for t, a in marks if t <= time.time() - 1.0]
            watermark = old[-1] if old else 0
            violations += check_snap(world, prev, cur, flip_ends_path=False)
            changes += [(v, s, watermark) for v, s in cur.states.items() if prev.states.get(v) != s]
            if time.time() - last_scan > 0.5:
                last_scan = time.time()
                violations += [StrayJob(f"{cur.where}: {len(p)} jobs run for v{v}: pids {p}")
                               for v, p in world.jobs().items() if len(p) > 1]
            prev = world.last = cur
            for name, p in list(procs.items()):
                if p.poll() is not None and time.time() < until - 1:
                    crashes += p.returncode == 70
                    respawns += 1
                    new = f"{name.split('.')[0]}.{respawns}"
                    del procs[name]
                    procs[new] = _spawn(home, url, pipeline, new, rng.randrange(2**31), until)
                elif p.poll() is None and time.time() > until + 120:
                    p.send_signal(signal.SIGUSR1)            # its threads' stacks into its log, then kill it
                    try:
                        p.wait(2)                            # faulthandler writes them at once
                    except subprocess.TimeoutExpired:
                        pass
                    p.kill()
                    stacks = (home.parent / f"{name}.log").read_text(errors="replace")[-4000:]
                    violations.append(Violation(f"worker {name} still ran 120 s after the end; killed. "
                                                f"Its log's end, with its stacks:\n{stacks}"))
        world.log.down = False
        end = world.step("reconcile", raise_first=False)  # the world's checks: trace, audit, pointer, jobs
        violations += end.violations
        violations += _audit_explains(world, changes)
        for f in sorted(home.glob("errors-*.txt")):
            violations += [UnexpectedError(f"worker {f.stem[7:]}: {line}") for line in f.read_text().splitlines()]
        return {"violations": violations, "polls": polls, "changes": len(changes), "crashes": crashes,
                "respawns": respawns, "final": world.last}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
        world.close()
        mp.undo()


def _check(result: dict, tmp_path: Path) -> None:
    final: Snap = result["final"]
    print(f"stress: {result['polls']} polls, {result['changes']} state changes seen, {result['crashes']} "
          f"workers crashed at a crash point, {result['respawns']} respawned; final states {final.states}, "
          f"alias {final.alias}")
    unique: dict[str, str] = {}                  # one line per violation, whenever it was first seen
    for v in result["violations"]:
        unique.setdefault(f"{type(v).__name__}: {re.sub(r'^watching [(][0-9.]+ s[)]: ', '', str(v))}", str(v))
    kinds = Counter(key.split(":")[0] for key in unique)
    logs = "".join(f"\n--- {p.name}:\n" + p.read_text()[-1500:] for p in sorted(tmp_path.glob("w*.log")))
    assert not unique, (f"{len(unique)} distinct invariant violations ({dict(kinds)}):\n"
                        + "\n".join(sorted(unique)[:40]) + logs)
    assert result["changes"] > 0, "the workers changed nothing: the stress test tested nothing"


def test_control_stress_sqlite(tmp_path, rng):
    _check(stress(tmp_path, f"sqlite:///{tmp_path / 'registry.db'}", rng), tmp_path)


def test_control_stress_postgresql(tmp_path, rng, postgres_url):
    _check(stress(tmp_path, postgres_url, rng), tmp_path)


if __name__ == "__main__":
    home_, url_, pipeline_, name_, seed_, until_ = json.loads(sys.argv[1])
    worker(Path(home_), url_, pipeline_, name_, seed_, until_)
