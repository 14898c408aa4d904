"""Crash between the Delta commit and Spark's checkpoint commit, then restart: no duplicate, no loss."""

from __future__ import annotations

import json

import pytest
from deltalake import DeltaTable
from std_helpers import V2, commits, run_in_process, run_job_process

from jobs.lib.rules.files import rules_path
from jobs.lib.runtime.status import read_status
from jobs.lib.source.checkpoint import last_committed_batch
from jobs.standardize import CRASH_HOOK
from orchestrator.core.tables import read_table

pytestmark = pytest.mark.integration


def output_commits(uri) -> list[int]:
    return sorted(h["batch_id"] for h in commits(uri))


def test_process_killed_after_delta_commit_then_restarted(bootstrap, changelog, paths):
    argv = paths.argv(bootstrap, changelog.topic, rules_path("titles", "v2"), max_records=1500)
    # a backfill capped by maxOffsetsPerTrigger, so that batch 1 exists and batch 2 comes after the restart
    argv = [*argv, "--extra", json.dumps({"backfill": "capped"})]
    code, log = run_job_process(argv, paths.run_dir / "job.log", env={CRASH_HOOK: "1"})
    assert code == 137, log[-3000:]
    assert f"{CRASH_HOOK}=1: dying after the Delta commit of micro-batch 1" in log
    # the crash window: Delta has batch 1, Spark's checkpoint does not
    assert DeltaTable(str(paths.output)).transaction_version("kappa.standardize.v1") == 1
    assert last_committed_batch(paths.checkpoint) == 0
    assert (paths.checkpoint / "offsets" / "1").exists()
    rejects_before = read_table(paths.rejects).num_rows

    code, log = run_job_process(argv, paths.run_dir / "job.log")
    assert code == 0, log[-3000:]
    assert (f"micro-batch 1 is in {paths.output} already (app transaction kappa.standardize.v1): not written again "
            f"(a replay after a restart)") in log
    expected = changelog.expected("v2")
    assert read_table(paths.output).sort_by("member_id").equals(expected.table)
    rejects = sorted((r["partition"], r["offset"], r["error"]) for r in read_table(paths.rejects).to_pylist())
    assert rejects == sorted(expected.rejects) and len(rejects) > rejects_before   # each once, exact reasons
    last = last_committed_batch(paths.checkpoint)
    assert output_commits(paths.output) == list(range(last + 1))  # batch 1 committed exactly once
    assert read_status(paths.run_dir)["state"] == "finished"


def test_replay_of_an_uncommitted_batch_in_process(spark, bootstrap, changelog, paths):
    """Delete the checkpoint's last commit file: Spark replays that batch, the sink skips it."""
    args = paths.args(bootstrap, changelog.topic, rules_path("titles", "v2"))
    args.extra = {"backfill": "capped"}
    run_in_process(spark, bootstrap, changelog.topic, args, V2)
    last = last_committed_batch(paths.checkpoint)
    table_version = DeltaTable(str(paths.output)).version()
    rejects_version = DeltaTable(str(paths.rejects)).version()
    (paths.checkpoint / "commits" / str(last)).unlink()
    (paths.checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)  # Hadoop's checksum file

    writer = run_in_process(spark, bootstrap, changelog.topic, args, V2)
    assert writer.skipped == [last]
    assert last_committed_batch(paths.checkpoint) == last
    assert DeltaTable(str(paths.output)).version() == table_version
    assert DeltaTable(str(paths.rejects)).version() == rejects_version
    expected = changelog.expected("v2")
    assert read_table(paths.output).sort_by("member_id").equals(expected.table)
    assert sorted((r["partition"], r["offset"], r["error"]) for r in read_table(paths.rejects).to_pylist()) == sorted(
        expected.rejects)
    assert output_commits(paths.output) == list(range(last + 1))


def test_a_micro_batch_without_rejects_commits_nothing_to_the_rejects_table(spark, bootstrap, paths, unique, seed):
    """Batch 0 creates the rejects table, empty, without a write; a later batch with no reject adds no
    commit to it (each commit under a transaction identifier costs Delta a state reconstruction), and
    a batch with rejects still commits them under its own batch id."""
    from orchestrator.dev.datagen import ensure_topic, generate_changelog, produce

    topic = f"profiles_clean_{unique}"
    ensure_topic(bootstrap, topic, partitions=4)
    clean = list(generate_changelog(1200, 300, seed=seed, malformed_share=0.0))
    produce(bootstrap, topic, clean[:900])
    args = paths.args(bootstrap, topic, rules_path("titles", "v2"))
    args.extra = {"backfill": "capped"}
    run_in_process(spark, bootstrap, topic, args, V2, max_records=450)
    produce(bootstrap, topic, clean[900:] + list(generate_changelog(40, 300, seed=seed + 1, malformed_share=1.0, delete_share=0.0,
                                                                       first_new=False)))
    run_in_process(spark, bootstrap, topic, args, V2, max_records=450)
    last = last_committed_batch(paths.checkpoint)
    assert last >= 2                                        # 900 records in two batches, then one
    assert output_commits(paths.output) == list(range(last + 1))
    with_rejects = sorted({r["batch_id"] for r in read_table(paths.rejects).to_pylist()})
    assert with_rejects and 0 not in with_rejects           # the malformed records came last
    assert output_commits(paths.rejects) == with_rejects
    history = DeltaTable(str(paths.rejects)).history()
    assert [h["version"] for h in history if h["operation"] == "CREATE TABLE"] == [0]
    assert len(history) == 1 + len(with_rejects)
