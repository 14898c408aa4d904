"""Fault scenario 4 (issue 33): the warehouse's disk full, during a backfill's write and during a live MERGE.

The warehouse (tables, rejects tables, alias pointers) is a small tmpfs mounted for this module; the
kappa home (registry, checkpoints, job logs) stays on the ordinary disk, as the warehouse of a real
deployment is a volume of its own. A real standardize job (Spark local, delta-spark) reads a topic of
the session broker. Each phase is forced to a known point: the job's micro-batch is read and held
before its commits (`KAPPA_TEST_HOLD_BEFORE_COMMIT`), the tmpfs is filled to the last byte, and the
batch released, so its write meets a full disk:

1. backfill: micro-batch 0 of a new version, the first write into its table;
2. live: micro-batch 1 of the same version once it serves, a MERGE into the served table.

Oracle: the job fails (its status says failed, and its error is one line naming the cause, "No space
left on device"); nothing partial is committed (the table's Delta log has the same commits as before,
each one whole JSON; Spark's checkpoint did not commit the batch; the served table and the pointer are
unchanged); once the filler file is deleted, the supervisor restarts the job from its checkpoint and
the version's table is exactly the oracle's derivation of the log (tests/served.py), the registry
consistent (the alias published, the version serving).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.control.control_live import DEADLINE, PARTITIONS, PIPELINE, Live, make_spec, served_equals_expected, wait_exact
from jobs.lib.sink.batches import HOLD_FILE, HOLD_HOOK
from orchestrator.context import Kappa
from orchestrator.core import crashpoints
from orchestrator.core.settings import resolve_settings
from orchestrator.core.settings import Settings
from orchestrator.dev import datagen
from orchestrator.jobctl import inspect_version
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote
from orchestrator.lifecycle.supervise import supervise_version
from orchestrator.registry import Registry
from orchestrator.serving import read_pointer
from tests.faults.fault_helpers import PIPELINES, Bed, verb_under_fault
from tests.unit.control.control_helpers import FakeLog, end_children
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.faults]

# The promote and rollback phases (the pointer file readers follow is on the warehouse too) run on a
# fake log with fake jobs, like scenario 3: their window is the control plane's, between the flip's
# compare-and-swap and the pointer's publish.

#: The warehouse's size: a few versions' small tables, a lot less than the machine's memory.
TMPFS_MB = 32
INITIAL, KEYS, LIVE = 400, 120, 60
ENOSPC = "No space left on device"


@pytest.fixture(scope="module")
def warehouse_tmpfs():
    """A TMPFS_MB tmpfs mounted on a fresh folder; unmounted (and the folder removed) at the end."""
    where = Path(tempfile.mkdtemp(prefix="kappa-fault-wh-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m,mode=0755", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        where.rmdir()
        pytest.fail(f"the disk-full scenario mounts a {TMPFS_MB} MB tmpfs as the warehouse and could not "
                    f"({done.stderr.strip() or done.returncode}): run the fault suite as root (or with "
                    f"CAP_SYS_ADMIN), as `deploy/dev.sh test` in CI does")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


def fill(where: Path) -> Path:
    """Fill the file system of `where` to its last byte with one file; that file."""
    filler = where / "filler.bin"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as f:
        while chunk:
            try:
                f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                chunk = chunk[: len(chunk) // 2]
    os.statvfs(where)   # the test's own check below says how full
    return filler


def free_bytes(where: Path) -> int:
    st = os.statvfs(where)
    return st.f_bavail * st.f_frsize


def delta_commits(table: str) -> list[str]:
    """The commits in a table's Delta log, each checked to be whole JSON (a half-written one fails)."""
    log = Path(table) / "_delta_log"
    names = sorted(p.name for p in log.glob("*.json")) if log.is_dir() else []
    for name in names:
        lines = (log / name).read_text().splitlines()
        assert lines, f"{log / name} is empty: a half commit"
        for ln in lines:
            json.loads(ln)   # raises on a torn line
    return names


def checkpoint_commits(checkpoint: str) -> list[str]:
    path = Path(checkpoint) / "commits"
    return sorted(p.name for p in path.iterdir() if p.name.isdigit()) if path.is_dir() else []


@pytest.fixture(scope="module")
def live(bootstrap, warehouse_tmpfs, tmp_path_factory, module_seed):
    unique = uuid.uuid4().hex[:8]
    topic, alias = f"diskfull_{unique}", f"diskfull_std_{unique}"
    datagen.ensure_topic(bootstrap, topic, PARTITIONS)
    home = tmp_path_factory.mktemp("kappa-disk-full")
    reg = Registry(f"sqlite:///{home / 'registry.db'}")
    k = Kappa(Settings(home=home, warehouse=str(warehouse_tmpfs), bootstrap_servers=bootstrap), registry=reg,
              pipelines={PIPELINE: make_spec(topic, alias, restart_backoff_seconds=1.0)})
    lv = Live(bootstrap, topic, alias, home, k, seed=module_seed)
    try:
        lv.produce(INITIAL, KEYS, first_new=True)
        yield lv
    finally:
        lv.close()
        reg.close()
        filler = warehouse_tmpfs / "filler.bin"
        if filler.exists():
            filler.unlink()


def _held(path: Path):
    wait_until(path.exists, f"the job's micro-batch to be held before its commits ({path})", DEADLINE, poll=0.2)


def _failed_on_full_disk(k, v: int) -> str:
    st = wait_until(lambda: inspect_version(k.version(PIPELINE, v)), f"v{v}'s job to fail on the full disk",
                    DEADLINE, poll=0.5, done=lambda s: s.failed)
    error = st.error or ""
    print(f"\nv{v} failed: {error}")
    assert "\n" not in error and ENOSPC in error, f"the job's error is not one line naming the cause: {error!r}"
    return error


def _supervised_back(k, v: int) -> dict:
    """The supervisor's pass over the failed version, once space is back: a restart from its checkpoint."""
    vr = k.version(PIPELINE, v)
    action = supervise_version(vr, inspect_version(vr), actor="supervisor")
    assert action and action["kind"] == "restart", f"the supervisor did not restart v{v}: {action}"
    return action


def _exact(live: Live, *, version: int | None = None) -> None:
    # an exception: the table not written yet (the restarted job's backfill runs)
    wait_exact(live, f"the {'served' if version is None else f'v{version}'} table", version=version,
               catch=(Exception,))


def test_disk_full_during_a_backfill_write_then_during_a_live_merge(live, warehouse_tmpfs, tmp_path, monkeypatch,
                                                                    fault_row):
    k, wh = live.k, warehouse_tmpfs
    held = tmp_path / "held"
    monkeypatch.setenv(HOLD_FILE, str(held))

    # -- phase 1: the backfill's write (micro-batch 0 into a new table) ------------------------------
    monkeypatch.setenv(HOLD_HOOK, "0")
    v = deploy(k, k.pipeline(PIPELINE), "v1", actor="fault-test", reason="disk full during the backfill").version
    paths = k.paths(PIPELINE, v)
    _held(held)
    filler = fill(wh)
    assert free_bytes(wh) == 0
    t0 = time.monotonic()
    held.unlink()
    error = _failed_on_full_disk(k, v)
    commits_then = delta_commits(paths.table)
    assert commits_then == [], f"a backfill on a full disk committed {commits_then}"
    assert "0" not in checkpoint_commits(paths.checkpoint), "Spark's checkpoint committed the failed batch 0"
    assert k.registry.get_alias(live.alias) is None and read_pointer(k.alias_file(live.alias)) is None
    filler.unlink()
    monkeypatch.setenv(HOLD_HOOK, "1")         # the restarted job holds its first live batch (phase 2)
    _supervised_back(k, v)
    _exact(live, version=v)
    healed = time.monotonic() - t0
    assert wait_ready(k.version(PIPELINE, v), deadline_seconds=DEADLINE, poll_seconds=1).ready
    promote(k.version(PIPELINE, v), actor="fault-test", reason="serve the version that survived a full disk")
    alias = k.registry.get_alias(live.alias)
    consistent = (alias.version, alias.published_version) == (v, v) and \
        read_pointer(k.alias_file(live.alias))["version"] == v and \
        k.registry.get_version(PIPELINE, v).state == "serving"
    fault_row(scenario="warehouse disk full", phase="backfill",
              fault=f"{TMPFS_MB} MB tmpfs filled while micro-batch 0 was held before its write",
              kappa=f"job failed ({error[:70]}...), nothing committed; supervisor restarted it from its checkpoint",
              healed_s=healed, exact=True, consistent=consistent)
    assert consistent

    # -- phase 2: a live MERGE into the served table (micro-batch 1) ---------------------------------
    served_before = delta_commits(paths.table)
    ok, msg = served_equals_expected(live, "v1")
    assert ok, msg
    live.produce(LIVE, KEYS)
    _held(held)
    filler = fill(wh)
    assert free_bytes(wh) == 0
    t0 = time.monotonic()
    held.unlink()
    error = _failed_on_full_disk(k, v)
    assert delta_commits(paths.table) == served_before, "a MERGE on a full disk changed the served table's log"
    assert "1" not in checkpoint_commits(paths.checkpoint), "Spark's checkpoint committed the failed batch 1"
    assert read_pointer(k.alias_file(live.alias))["version"] == v
    filler.unlink()
    monkeypatch.delenv(HOLD_HOOK)
    _supervised_back(k, v)
    _exact(live)
    healed = time.monotonic() - t0
    alias = k.registry.get_alias(live.alias)
    consistent = (alias.version, alias.published_version) == (v, v) and \
        read_pointer(k.alias_file(live.alias))["version"] == v and \
        k.registry.get_version(PIPELINE, v).state == "serving"
    fault_row(scenario="warehouse disk full", phase="live",
              fault=f"{TMPFS_MB} MB tmpfs filled while live micro-batch 1 (a MERGE) was held before its write",
              kappa=f"job failed ({error[:70]}...), served table unchanged; supervisor restarted it",
              healed_s=healed, exact=True, consistent=consistent)
    assert consistent


@pytest.fixture
def control_bed(warehouse_tmpfs, tmp_path, monkeypatch):
    """A pipeline on a fake log with fake jobs, its warehouse on the module's tmpfs, its registry on disk."""
    for var in list(os.environ):
        if var.startswith("KAPPA_"):
            monkeypatch.delenv(var)
    warehouse = warehouse_tmpfs / f"control-{uuid.uuid4().hex[:8]}"
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(PIPELINES)
    home = tmp_path / "home"
    url = f"sqlite:///{home / 'registry.db'}"
    k = Kappa(resolve_settings(home=str(home), pipelines_file=str(pipelines), bootstrap_servers="127.0.0.1:9",
                               registry_url=url, warehouse=str(warehouse), env={}))
    try:
        yield Bed(k, home, pipelines, url, FakeLog({0: 100, 1: 50}).install(monkeypatch))
    finally:
        crashpoints.disarm()
        (warehouse_tmpfs / "filler.bin").unlink(missing_ok=True)
        end_children()
        k.close()


@pytest.mark.parametrize("verb", ["promote", "rollback"])
def test_disk_full_between_the_flip_and_the_pointer_publish(control_bed, warehouse_tmpfs, fault_row, verb):
    filler = warehouse_tmpfs / "filler.bin"

    def inject():
        fill(warehouse_tmpfs)
        assert free_bytes(warehouse_tmpfs) == 0

    out = verb_under_fault(control_bed, verb, f"{verb}.flipped", inject, lambda: filler.unlink(missing_ok=True),
                           ENOSPC, "kappa reconcile")
    fault_row(scenario="warehouse disk full", phase=verb,
              fault=f"{TMPFS_MB} MB tmpfs filled between the flip (registry) and the pointer publish",
              kappa=out.did, healed_s=out.seconds, exact=out.exact, consistent=out.consistent)
    assert not out.problems, out.problems
