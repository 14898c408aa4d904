"""Read progress of a one-batch backfill, without services: the files the job's driver writes
(`jobs.lib.source.read_progress`), the positions the orchestrator derives from them, the lag
arithmetic over them, and the floor that keeps an uncommitted backfill from counting as caught up."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import pytest

from jobs.lib.source.read_progress import (
    MANIFEST, BatchProgress, RangeReport, ReadPosition, backfill_reading, progress_dir, progress_positions,
    read_progress, source_dir, write_manifest,
)
from jobs.lib.sink.batches import HOLD_FILE, HOLD_HOOK, hold_if_asked
from orchestrator.observe.lag import fmt_lag, lag_from_offsets, pending_floor, uncommitted_limits
from tests.waiting import wait_until

T = "views"


def batch(reads: dict, *, scans: int = 1, start=None, end=None) -> BatchProgress:
    return BatchProgress(start or {(T, 0): 0, (T, 1): 0}, end or {(T, 0): 100, (T, 1): 40}, scans, reads)


def test_positions_count_what_is_read_and_stop_at_the_first_unread_offset():
    # partition 0 split in two ranges: the first half read, the second a quarter; partition 1 unreported
    got = progress_positions([batch({(T, 0, 0, 50): 50, (T, 0, 50, 100): 12})])
    assert got[(T, 0)] == ReadPosition(next_offset=62, unread=38, end=100)
    assert got[(T, 1)] == ReadPosition(next_offset=0, unread=40, end=40)


def test_an_unreported_first_range_keeps_the_next_offset_at_the_start():
    got = progress_positions([batch({(T, 0, 50, 100): 50})])
    assert got[(T, 0)] == ReadPosition(next_offset=0, unread=50, end=100)


def test_two_scans_of_a_range_count_half_each_and_never_more_than_the_range():
    one_scan_done = progress_positions([batch({(T, 0, 0, 100): 100}, scans=2)])
    assert one_scan_done[(T, 0)] == ReadPosition(next_offset=50, unread=50, end=100)
    both = progress_positions([batch({(T, 0, 0, 100): 200 + 80}, scans=2)])   # a retried task's report
    assert both[(T, 0)] == ReadPosition(next_offset=100, unread=0, end=100)


def test_ranges_outside_the_batch_are_ignored_and_the_slower_source_wins():
    stray = batch({(T, 0, 100, 200): 100, (T, 0, 0, 100): 10})
    assert progress_positions([stray])[(T, 0)].unread == 90
    fast, slow = batch({(T, 0, 0, 100): 90}), batch({(T, 0, 0, 100): 20})
    assert progress_positions([fast, slow])[(T, 0)] == ReadPosition(next_offset=20, unread=80, end=100)
    assert progress_positions([slow, fast])[(T, 0)] == ReadPosition(next_offset=20, unread=80, end=100)


def test_reports_round_trip_through_the_checkpoint_and_a_new_plan_drops_old_ones(tmp_path):
    where = source_dir(progress_dir(tmp_path), (T, "clicks"))
    assert where.endswith(os.path.join("kappa-read-progress", f"clicks+{T}"))
    write_manifest(where, {(T, 0): 0}, {(T, 0): 100}, scans=1)
    report = RangeReport(where, T, 0, 0, 100)
    report.update(30)
    report.update(60)               # within REPORT_SECONDS of the last write: not written
    (got,) = read_progress(tmp_path)
    assert (got.start, got.end, got.scans, got.reads) == ({(T, 0): 0}, {(T, 0): 100}, 1, {(T, 0, 0, 100): 30})
    report.update(100, final=True)
    assert read_progress(tmp_path)[0].reads == {(T, 0, 0, 100): 100}
    write_manifest(where, {(T, 0): 0}, {(T, 0): 100}, scans=2)   # a second scan keeps the reports
    assert read_progress(tmp_path)[0].scans == 2 and read_progress(tmp_path)[0].reads
    write_manifest(where, {(T, 0): 0}, {(T, 0): 120}, scans=1)   # a new run's plan: reports of the old are gone
    assert read_progress(tmp_path)[0].reads == {}
    (tmp_path / "kappa-read-progress" / f"clicks+{T}" / MANIFEST).write_text("{half")
    assert read_progress(tmp_path) == []


def test_the_status_reading_counts_offsets_read_until_the_checkpoint_commits_a_batch(tmp_path):
    assert backfill_reading(tmp_path) is None
    where = source_dir(progress_dir(tmp_path), (T,))
    write_manifest(where, {(T, 0): 0, (T, 1): 0}, {(T, 0): 100, (T, 1): 40}, scans=2)
    RangeReport(where, T, 0, 0, 100).update(100, final=True)
    assert backfill_reading(tmp_path) == {"batch_id": 0, "records_read": 50, "records_total": 140}
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "0").write_text("v1\n{}\n")
    assert backfill_reading(tmp_path) is None


def test_progress_lives_under_a_local_checkpoint_only(tmp_path):
    assert progress_dir(tmp_path) == os.path.join(str(tmp_path), "kappa-read-progress")
    assert progress_dir(f"file://{tmp_path}/ck%20pt") == os.path.join(f"{tmp_path}/ck pt", "kappa-read-progress")
    assert progress_dir("s3://bucket/state/p/v1/checkpoint") is None
    assert read_progress("s3://bucket/state/p/v1/checkpoint") == [] and backfill_reading("gs://b/c") is None


def test_a_report_whose_directory_is_gone_is_dropped_quietly(tmp_path):
    report = RangeReport(str(tmp_path / "committed-and-cleared"), T, 0, 0, 10)
    report.update(5, final=True)
    report.update(10, final=True)
    assert report._off and not (tmp_path / "committed-and-cleared").exists()


LOGS = {(T, 0): (0, 130), (T, 1): (0, 40)}


def test_lag_from_read_progress_counts_the_unread_and_what_came_after_the_batch():
    reading = {(T, 0): ReadPosition(next_offset=62, unread=38, end=100)}
    r = lag_from_offsets("p", 1, LOGS, None, {(T, 0): 0, (T, 1): 0}, at=1.0, reading=reading)
    assert r.source == "reading" and r.pending_commit
    assert r.partitions == {f"{T}:0": 38 + 30, f"{T}:1": 40} and r.total == 108
    d0, d1 = r.details
    assert (d0.next_offset, d0.source, d1.next_offset, d1.source) == (62, "reading", 0, "group")


def test_a_committed_checkpoint_wins_over_read_progress():
    reading = {(T, 0): ReadPosition(next_offset=100, unread=0, end=100)}
    r = lag_from_offsets("p", 1, LOGS, {(T, 0): 100, (T, 1): 40}, at=1.0, batch_id=0, reading=reading)
    assert (r.source, r.pending_commit, r.total) == ("checkpoint", False, 30)


def fake_version(threshold: int, max_seconds: float = 60.0, override=None):
    """What the limits read of a `VersionRef`: the spec's catch-up limits and the deploy's override."""
    spec = SimpleNamespace(catchup_threshold=threshold, catchup_seconds=max_seconds)
    rec = SimpleNamespace(details={} if override is None else {"threshold": override})
    return SimpleNamespace(spec=spec, record=rec)


@pytest.mark.parametrize("threshold, max_seconds, override, limits", [
    (0, 60.0, None, (1, 61.0)), (1000, 30.0, None, (1001, 31.0)), (0, 60.0, 500, (501, 61.0)),
])
def test_uncommitted_limits_sit_just_over_the_catch_up_rule(threshold, max_seconds, override, limits):
    assert uncommitted_limits(fake_version(threshold, max_seconds, override)) == limits


def test_a_fully_read_uncommitted_backfill_is_floored_over_the_rule():
    done = {(T, 0): ReadPosition(next_offset=130, unread=0, end=130), (T, 1): ReadPosition(40, 0, 40)}
    r = lag_from_offsets("p", 1, LOGS, None, None, at=1.0, reading=done).model_copy(update={"lag_seconds": 0.0})
    assert r.total == 0
    floored = pending_floor(fake_version(1000, 30.0), r)
    assert (floored.total, floored.lag_seconds, floored.partitions) == (1001, 31.0, r.partitions)
    assert floored.floored and floored.unread == 0
    assert fmt_lag(floored.total, floored=floored.floored, unread=floored.unread) == \
        "≥ 1,001 (first batch not yet committed; 0 left to read)"
    partly = lag_from_offsets("p", 1, LOGS, None, None, at=1.0, reading={(T, 0): ReadPosition(0, 130, 130)})
    over = pending_floor(fake_version(0), partly)
    assert (over.total, over.floored) == (170, False)              # over the floor: the real figure


def test_the_hold_hook_waits_until_the_test_deletes_its_file(tmp_path, monkeypatch):
    held = tmp_path / "held"
    monkeypatch.setenv(HOLD_HOOK, "0")
    monkeypatch.setenv(HOLD_FILE, str(held))
    hold_if_asked(1)                 # another batch: no hold
    assert not held.exists()
    t = threading.Thread(target=hold_if_asked, args=(0,), daemon=True)
    t.start()
    wait_until(held.exists, "the hook to write its file", 10)
    assert t.is_alive()
    held.unlink()
    t.join(10)
    assert not t.is_alive()


def test_the_hold_hook_holds_each_batch_it_lists_in_turn(tmp_path, monkeypatch):
    """`0,3`: one job process held at its backfill, then again at a live batch (the broker-kill scenario)."""
    held = tmp_path / "held"
    monkeypatch.setenv(HOLD_HOOK, "0, 3")
    monkeypatch.setenv(HOLD_FILE, str(held))
    for batch_id in (1, 2, 4):
        hold_if_asked(batch_id)      # not listed: no hold
        assert not held.exists()
    for batch_id in (0, 3):
        t = threading.Thread(target=hold_if_asked, args=(batch_id,), daemon=True)
        t.start()
        wait_until(held.exists, f"the hook to write its file for batch {batch_id}", 10)
        assert t.is_alive()
        held.unlink()
        t.join(10)
        assert not t.is_alive()
