"""`kappa retire` and `kappa retention --apply` for real, each a separate `kappa` process.

Four versions of a small standardize pipeline run on the session broker (real Spark jobs, real
Delta tables, real consumer groups): v1 stopped, v2 a running standby, v3 the rollback target,
v4 serving. The CLI retires v1 by name, then retention (keep 2) retires v2 and keeps v3 and v4,
and a retire of the rollback target is refused. Everything is checked from outside the product:
the directories are gone, the broker no longer lists the retired versions' consumer groups, a
retired job's process is gone, and the kept versions (tables, checkpoints, groups, jobs), the
alias, its pointer file and its history are exactly as they were.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pyarrow as pa
import pytest

from orchestrator.context import Kappa
from orchestrator.core.settings import Settings
from orchestrator.dev import datagen
from orchestrator.jobctl import inspect_version, stop_version
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote
from tests.waiting import wait_until
from tests.pipelines import standardize_pipeline
from tests.shell import users_env
from orchestrator.core.tables import read_table

pytestmark = pytest.mark.integration

#: JVM start plus a tiny backfill on 2 shared cores: generous, never relied upon for timing.
DEADLINE = float(os.environ.get("KAPPA_TEST_READY_DEADLINE", "900"))
RECORDS, KEYS, PARTITIONS = 240, 90, 2
KAPPA = [sys.executable, "-m", "orchestrator.cli"]
ACTOR = "ops:retention-test"


@dataclass
class Bed:
    k: Kappa
    pipeline: str
    alias: str
    topic: str
    bootstrap: str
    home: Path
    pipelines_file: Path

    def kappa(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """One `kappa` process on this home, settings by flag only (no KAPPA_* from the environment but the jobs'
        JIT: `tests.shell.users_env`)."""
        env = users_env()
        return subprocess.run([*KAPPA, "--home", str(self.home), "--pipelines-file", str(self.pipelines_file),
                               "--bootstrap-servers", self.bootstrap, *args],
                              capture_output=True, text=True, timeout=timeout, env=env)

    def deploy_ready(self, *rules: str) -> list[int]:
        """A version per rules file, deployed at once (queued: no job waits for the one before it to
        catch up, so their JVM starts and backfills overlap), then each waited for until ready."""
        infos = [deploy(self.k, self.k.pipeline(self.pipeline), r, actor=ACTOR, reason=f"rules {r}", queue=True) for r in rules]
        for info in infos:
            wait_ready(self.k.version(self.pipeline, info.version), deadline_seconds=DEADLINE, poll_seconds=1)
        return [info.version for info in infos]


@pytest.fixture
def bed(bootstrap, tmp_path, seed):
    unique = uuid.uuid4().hex[:8]
    pipeline, topic = f"ret_{unique}", f"ret_profiles_{unique}"
    alias = f"{pipeline}_served"
    pipelines_file = tmp_path / "pipelines.toml"
    pipelines_file.write_text(standardize_pipeline(pipeline, topic, alias=alias))
    datagen.ensure_topic(bootstrap, topic, partitions=PARTITIONS)
    datagen.produce(bootstrap, topic, datagen.generate_changelog(RECORDS, KEYS, seed=seed))
    home = tmp_path / "home"
    k = Kappa(Settings(home=home, pipelines_file=pipelines_file, bootstrap_servers=bootstrap))
    b = Bed(k, pipeline, alias, topic, bootstrap, home, pipelines_file)
    try:
        yield b
    finally:
        for rec in k.registry.list_versions(pipeline):
            if inspect_version(k.version(pipeline, rec.version)).alive:
                stop_version(k.version(pipeline, rec.version), actor="tests", reason="test teardown", force=True,
                             graceful_timeout=20, final_state=None)
        k.close()


# -- what the broker and the files say, read without kappa ---------------------------------------

@functools.cache
def admin(bootstrap: str):
    """A plain AdminClient of this test's own (not kappa's), one per broker."""
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def listed_groups(bootstrap: str) -> set[str]:
    res = admin(bootstrap).list_consumer_groups(request_timeout=10).result()
    assert not res.errors, res.errors
    return {g.group_id for g in res.valid}


def committed(bootstrap: str, group: str, topic: str) -> dict[tuple[str, int], int]:
    from orchestrator.observe.lag import committed_offsets

    parts = admin(bootstrap).list_topics(topic, timeout=10).topics[topic].partitions
    return committed_offsets({"bootstrap.servers": bootstrap}, group, [(topic, p) for p in parts])


def end_offsets(bootstrap: str, topic: str) -> dict[tuple[str, int], int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        return {(topic, p): c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)}
    finally:
        c.close()


def table_rows(path: Path) -> pa.Table:
    return read_table(str(path)).sort_by("member_id")


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_retire_and_retention_apply_delete_what_they_name_and_nothing_else(bed):
    k, p = bed.k, bed.pipeline
    reg = k.registry
    v1, *later = bed.deploy_ready("v1", "v2", "v1", "v2")
    assert (v1, later) == (1, [2, 3, 4])
    stop_version(k.version(p, v1), actor=ACTOR, reason="superseded before it served")
    for n in later:
        promote(k.version(p, n), actor=ACTOR, reason=f"serve v{n}")
    assert {r.version: str(r.state) for r in reg.list_versions(p)} == {
        1: "stopped", 2: "standby", 3: "standby", 4: "serving"}
    alias = reg.get_alias(bed.alias)
    assert (alias.version, alias.previous_version) == (4, 3)

    paths = {n: k.paths(p, n) for n in (1, 2, 3, 4)}
    ends = end_offsets(bed.bootstrap, bed.topic)
    assert sum(ends.values()) == RECORDS
    for vp in paths.values():
        wait_until(lambda: committed(bed.bootstrap, vp.group_id, bed.topic), f"consumer group {vp.group_id} to commit the "
                   f"end offsets {ends}", timeout=60, poll=0.5, done=lambda offsets: offsets == ends)
        assert Path(vp.table).is_dir() and Path(vp.checkpoint).is_dir()
    assert {vp.group_id for vp in paths.values()} <= listed_groups(bed.bootstrap)
    v2_pid = reg.get_version(p, 2).pid
    assert inspect_version(k.version(p, 2)).alive and psutil.pid_exists(v2_pid)
    kept_jobs = {n: reg.get_version(p, n).pid for n in (3, 4)}
    kept_tables = {n: table_rows(paths[n].table) for n in (3, 4)}
    assert all(t.num_rows > 0 for t in kept_tables.values())
    pointer_file = Path(k.alias_file(bed.alias))
    pointer_before = pointer_file.read_bytes()
    history_before = reg.alias_history(bed.alias)

    # 1. retire v1 (stopped) by name
    existed = {n: [what for what, path in (("table", paths[n].table), ("rejects table", paths[n].rejects),
                                           ("checkpoint and run dir", paths[n].version_dir)) if Path(path).exists()]
               for n in (1, 2)}
    assert {"table", "checkpoint and run dir"} <= set(existed[1]) and {"table", "checkpoint and run dir"} <= set(existed[2])
    retired = bed.kappa("retire", p, "1", "--yes", "--actor", ACTOR, "--reason", "never served", "--json")
    assert retired.returncode == 0, retired.stdout + retired.stderr
    out = json.loads(retired.stdout)
    where = {"table": paths[1].table, "rejects table": paths[1].rejects,
             "checkpoint and run dir": paths[1].version_dir}
    assert out["done"] == (["job stopped"] + [f"deleted {what} {where[what]}" for what in existed[1]]
                           + [f"consumer group {paths[1].group_id}: deleted"])
    assert out["dry_run"] is False and out["bytes_freed"] > 0
    assert not Path(paths[1].table).exists() and not Path(paths[1].rejects).exists() and not paths[1].version_dir.exists()
    assert paths[1].group_id not in listed_groups(bed.bootstrap)
    assert committed(bed.bootstrap, paths[1].group_id, bed.topic) == {}
    assert reg.get_version(p, 1).state == "retired"

    # 2. retention: a dry run names v2 and deletes nothing; --apply retires it, job included
    dry = bed.kappa("retention", p, "--json")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    plan = json.loads(dry.stdout)
    assert (plan["dry_run"], plan["keep"], plan["kept"], plan["retire"], plan["protected"]) == (True, 2, [3, 4], [2], {})
    assert Path(paths[2].table).exists() and inspect_version(k.version(p, 2)).alive and reg.get_version(p, 2).state == "standby"

    applied = bed.kappa("retention", p, "--apply", "--actor", ACTOR, "--json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    plan = json.loads(applied.stdout)
    assert (plan["dry_run"], plan["kept"], plan["retire"], plan["protected"]) == (False, [3, 4], [2], {})
    assert plan["message"] == f"{p}: keep [3, 4]; retired [2]"
    where = {"table": paths[2].table, "rejects table": paths[2].rejects,
             "checkpoint and run dir": paths[2].version_dir}
    (result,) = plan["results"]
    assert result["done"] == (["job stopped"] + [f"deleted {what} {where[what]}" for what in existed[2]]
                              + [f"consumer group {paths[2].group_id}: deleted"])
    assert gone(v2_pid)
    assert not Path(paths[2].table).exists() and not Path(paths[2].rejects).exists() and not paths[2].version_dir.exists()
    assert paths[2].group_id not in listed_groups(bed.bootstrap)
    assert committed(bed.bootstrap, paths[2].group_id, bed.topic) == {}
    assert reg.get_version(p, 2).state == "retired"

    # 3. the rollback target is refused, and the refusal changes nothing
    refused = bed.kappa("retire", p, "3", "--yes", "--actor", ACTOR, "--reason", "too eager")
    assert refused.returncode == 3  # a refusal, not an error
    assert refused.stderr.strip() == (f"Error: cannot retire {p} v3: it is the rollback target of alias "
                                      f"'{bed.alias}'; promote or roll back to another version first")

    # the kept versions, the alias and its readers: exactly as before
    for n in (3, 4):
        assert table_rows(paths[n].table).equals(kept_tables[n]), f"v{n}'s table changed"
        assert Path(paths[n].checkpoint).is_dir()
        assert committed(bed.bootstrap, paths[n].group_id, bed.topic) == ends
        assert inspect_version(k.version(p, n)).alive and reg.get_version(p, n).pid == kept_jobs[n]
    assert {paths[3].group_id, paths[4].group_id} <= listed_groups(bed.bootstrap)
    assert {r.version: str(r.state) for r in reg.list_versions(p)} == {
        1: "retired", 2: "retired", 3: "standby", 4: "serving"}
    assert reg.get_alias(bed.alias) == alias
    assert pointer_file.read_bytes() == pointer_before
    assert reg.alias_history(bed.alias) == history_before
    from orchestrator.serving import open_alias

    assert read_table(open_alias(bed.alias, k.settings)).sort_by("member_id").equals(kept_tables[4])

    audit = [(e.version, e.actor, e.outcome, e.reason) for e in reg.audit_log(p, action="retire")]
    assert audit == [(1, ACTOR, "ok", "never served"), (2, ACTOR, "ok", "retention: keep the last 2"),
                     (3, ACTOR, "refused", "too eager")]
