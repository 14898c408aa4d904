"""Exactly-once output of the standardize job where the old data path was wrong, real broker,
Spark and Delta: keys in two partitions (issue 8 b), a restart from another checkpoint (e), and
SIGKILL mid-backfill and mid-live followed by a restart (forced by the job's pause hook)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable
from std_helpers import V2, run_in_process, run_job_process

from jobs.lib.rules.files import rules_path
from jobs.lib.sink.tables import PAUSE_FILE, PAUSE_HOOK
from jobs.standardize import CRASH_HOOK
from orchestrator.core.tables import read_table
from orchestrator.dev.datagen import ensure_topic, generate_changelog, iter_log, produce
from tests.oracle.standardize import expected_table
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

BASE_MS = 1_700_000_000_000


def profile(name: str, title: str = "Engineer") -> bytes:
    return json.dumps({"name": name, "title": title, "company": "Acme", "location": "Oslo",
                       "updated_at": "2026-01-01T00:00:00Z"}).encode()


def send(bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes | None, int]]) -> None:
    """(partition, key, value, timestamp ms), in order."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, "acks": "all"})
    for part, key, value, ts in records:
        p.produce(topic, key=key, value=value, partition=part, timestamp=ts)
        p.poll(0)
    assert p.flush(30) == 0


def served(uri) -> dict[str, dict]:
    return {r["member_id"]: r for r in read_table(uri).to_pylist()}


def test_a_key_in_two_partitions_is_refused_by_default(spark, bootstrap, unique, paths):
    """Partition 1 holds the newer value of m1 at a LOWER offset than partition 0's stale one: an
    order by offset picks the stale value; kappa refuses and names the key."""
    topic = f"two_parts_{unique}"
    ensure_topic(bootstrap, topic, partitions=2)
    send(bootstrap, topic, [(0, b"m0", profile("filler"), BASE_MS), (0, b"m1", profile("stale"), BASE_MS + 1),
                            (1, b"m1", profile("newest"), BASE_MS + 5)])
    args = paths.args(bootstrap, topic, V2.path)
    with pytest.raises(Exception) as e:
        run_in_process(spark, bootstrap, topic, args, V2)
    message = str(e.value)
    assert "SinkError: micro-batch 0: key(s) found in more than one Kafka partition" in message
    assert "m1 (partitions of this micro-batch)" in message and 'key_order = "timestamp"' in message
    assert not DeltaTable.is_deltatable(str(paths.output))   # nothing committed


def test_key_order_timestamp_orders_across_partitions_and_batches(spark, bootstrap, unique, paths):
    """Under key_order=timestamp the later record timestamp wins, also against the row already in
    the table: a stale value from another partition in a later micro-batch does not win."""
    topic = f"ts_order_{unique}"
    ensure_topic(bootstrap, topic, partitions=2)
    send(bootstrap, topic, [(0, b"m1", profile("old"), BASE_MS), (0, b"m2", profile("m2-first"), BASE_MS),
                            (1, b"m1", profile("newest"), BASE_MS + 10), (0, b"m1", profile("older"), BASE_MS + 5)])
    args = paths.args(bootstrap, topic, V2.path)
    args.extra = {"key_order": "timestamp"}
    run_in_process(spark, bootstrap, topic, args, V2)
    rows = served(paths.output)
    assert rows["m1"]["name"] == "newest" and rows["m1"]["source_partition"] == 1
    # a later micro-batch: a stale m1 in partition 0 (older timestamp, higher offset), a newer m2 in partition 1
    send(bootstrap, topic, [(0, b"m1", profile("late-but-stale"), BASE_MS + 7),
                            (1, b"m2", profile("m2-moved"), BASE_MS + 20)])
    writer = run_in_process(spark, bootstrap, topic, args, V2)
    assert [t["batch_id"] for t in writer.timings] == [1]
    rows = served(paths.output)
    assert (rows["m1"]["name"], rows["m2"]["name"]) == ("newest", "m2-moved")
    assert len(read_table(paths.output)) == 2


def test_restart_from_another_checkpoint_is_refused(spark, bootstrap, changelog, paths, tmp_path):
    """The table holds batches 0..N of one checkpoint; a new checkpoint's batch 0 covers other
    offsets: the job refuses instead of skipping batches by id (which lost data) or duplicating.
    (A new checkpoint whose batches cover the same offsets is a replay, and is skipped.)"""
    args = paths.args(bootstrap, changelog.topic, V2.path)
    args.extra = {"backfill": "capped"}
    run_in_process(spark, bootstrap, changelog.topic, args, V2)
    before = DeltaTable(str(paths.output)).version()
    args.checkpoint = str(tmp_path / "another_checkpoint")   # planned with another cap: other batch ends
    with pytest.raises(Exception) as e:
        run_in_process(spark, bootstrap, changelog.topic, args, V2, max_records=1000)
    message = str(e.value)
    assert "already holds micro-batch 0" in message and "the checkpoint is not the one the table was written from" in message
    assert DeltaTable(str(paths.output)).version() == before
    assert read_table(paths.output).sort_by("member_id").equals(changelog.expected("v2").table)


# -- SIGKILL mid-backfill and mid-live ------------------------------------------------------------

def start_paused(argv: list[str], log_path: Path, pause_at: str, pause_file: Path) -> subprocess.Popen:
    from jobs.lib.runtime.session import spark_env

    log_path.parent.mkdir(parents=True, exist_ok=True)
    out = open(log_path, "ab")
    env = {**os.environ, **spark_env(), PAUSE_HOOK: pause_at, PAUSE_FILE: str(pause_file)}
    return subprocess.Popen([sys.executable, "-m", "jobs.run", *argv], stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the job and everything it started (the Spark JVM, Python workers)."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def table_files_diff(uri: Path) -> str | None:
    """None when no live file is referenced twice and every referenced file exists."""
    import pyarrow as pa

    paths = pa.table(DeltaTable(str(uri)).get_add_actions(flatten=True))["path"].to_pylist()
    missing = [p for p in paths if not (uri / p).exists()]
    if len(paths) != len(set(paths)) or missing:
        return f"{len(paths) - len(set(paths))} files referenced twice, missing: {missing[:3]}"
    return None


def exact(uri: Path, rejects: Path, expected) -> None:
    out = read_table(uri)
    assert len(set(out["member_id"].to_pylist())) == out.num_rows  # no duplicate row
    assert out.sort_by("member_id").equals(expected.table)
    got = sorted((r["partition"], r["offset"], r["error"]) for r in read_table(rejects).to_pylist())
    assert got == sorted(expected.rejects)
    assert table_files_diff(uri) is None and table_files_diff(rejects) is None


def test_sigkill_mid_backfill_at_read_then_at_commit_then_restart(bootstrap, changelog, paths, tmp_path):
    """Killed with the backfill read and transformed but nothing written; restarted and killed again
    with its rejects committed and its output not: the last restart gives exactly the expected table
    and rejects."""
    argv = paths.argv(bootstrap, changelog.topic, rules_path("titles", "v2"))
    for point in ("read", "commit"):
        pause = tmp_path / f"paused-{point}"
        proc = start_paused(argv, paths.run_dir / "job.log", f"{point}:0", pause)
        try:
            wait_until(lambda: pause.exists() or proc.poll() is not None, f"the job to reach its pause at {point}", 240)
            assert proc.poll() is None, (paths.run_dir / "job.log").read_text()[-3000:]
        finally:
            kill_group(proc)
        assert not DeltaTable.is_deltatable(str(paths.output))
        # the rejects table is created empty while the first batch is read; its rejects come at commit
        assert DeltaTable.is_deltatable(str(paths.rejects))
        assert (read_table(paths.rejects).num_rows > 0) == (point == "commit")
    code, log = run_job_process(argv, paths.run_dir / "job.log")
    assert code == 0, log[-3000:]
    exact(paths.output, paths.rejects, changelog.expected("v2"))


def test_sigkill_mid_live_then_restart(bootstrap, changelog, paths, tmp_path, seed):
    """Backfill done, then a live micro-batch killed with its files written but not committed; the
    restart (available-now) replays it: exactly the expected table of the whole log."""
    argv = paths.argv(bootstrap, changelog.topic, rules_path("titles", "v2"))
    code, log = run_job_process(argv, paths.run_dir / "job.log")
    assert code == 0, log[-3000:]
    produce(bootstrap, changelog.topic, generate_changelog(600, 1000, seed=seed + 1, malformed_share=0.05,
                                                          delete_share=0.1, first_new=False))
    live = [a if a != "available-now" else "continuous" for a in argv]
    pause = tmp_path / "paused"
    proc = start_paused(live, paths.run_dir / "job.log", "commit:1", pause)
    try:
        wait_until(lambda: pause.exists() or proc.poll() is not None, "the live batch to reach its commit", 240)
        assert proc.poll() is None, (paths.run_dir / "job.log").read_text()[-3000:]
    finally:
        kill_group(proc)
    assert DeltaTable(str(paths.output)).transaction_version("kappa.standardize.v1") == 0
    code, log = run_job_process(argv, paths.run_dir / "job.log", env={CRASH_HOOK: ""})
    assert code == 0, log[-3000:]
    everything = list(iter_log(bootstrap, changelog.topic))
    assert len(everything) == 4600
    exact(paths.output, paths.rejects, expected_table(everything, "v2"))
