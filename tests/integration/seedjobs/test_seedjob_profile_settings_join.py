"""profile_settings_join, run as a process (`python -m jobs.run --job jobs.profile_settings_join:transform`): the joined table
equals the join computed from the produced changelogs; status.json reports what the job read."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from jobs.lib.runtime.session import spark_env
from jobs.lib.runtime.status import read_status
from orchestrator.dev import seedgen
from seedjob_helpers import JobRun, expected_joined

pytestmark = pytest.mark.integration

START = datetime(2024, 5, 1, 8, 0, tzinfo=timezone.utc)
REPO = Path(__file__).resolve().parents[3]


def test_profile_settings_join_as_a_process(bootstrap, unique, tmp_path):
    profiles_topic, settings_topic = f"member_profiles_{unique}", f"member_settings_{unique}"
    seedgen.create_topics(bootstrap, {profiles_topic: 2, settings_topic: 2},
                          compacted=[profiles_topic, settings_topic])
    members = seedgen.member_ids(12)
    profiles = seedgen.member_profiles(profiles_topic, members, START, updates=10, deletes=2)
    settings = seedgen.member_settings(settings_topic, members[:8], START, updates=6, deletes=2)
    later = seedgen.to_ms(START + timedelta(hours=2))
    deleted = next(r.key for r in profiles if r.value is None)
    edge = [
        # settings of a member without a profile: no row
        seedgen.SeedRecord(settings_topic, b"m0000100", b'{"language": "en"}', later),
        # a deleted profile comes back: joined with the settings kept in state
        seedgen.SeedRecord(profiles_topic, deleted, b'{"name": "Back Again", "zip": "10115"}', later + 1),
    ]
    bad = [
        seedgen.SeedRecord(profiles_topic, members[0].encode(), b'{"title": "no name"}', later + 2),
        seedgen.SeedRecord(settings_topic, members[1].encode(), b'{"visibility": "everyone"}', later + 3),
        seedgen.SeedRecord(settings_topic, members[2].encode(), b"\x00garbage", later + 4),
        # (no record without a key: a compacted topic refuses it, as Apache Kafka does)
        seedgen.SeedRecord(profiles_topic, b"\xc3\x28", b'{"name": "Bad Key"}', later + 6),
    ]
    produced = seedgen.produce(bootstrap, seedgen.by_time(profiles, settings) + edge + bad)

    # capped batches from the start (not the one-batch backfill): the join state carries across them
    job = JobRun(tmp_path, "profile_settings_join", f"psj_{unique}", bootstrap,
                 [profiles_topic, settings_topic], max_records=25,
                 extra={"backfill": "capped"})
    proc = subprocess.run([sys.executable, "-m", "jobs.run", *job.argv], cwd=REPO,
                          env={**os.environ, **spark_env()}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    status = read_status(job.run_dir)
    assert status["state"] == "finished" and status["error"] is None
    assert status["rows_in"] == len(produced)
    assert status["rejects"] == status["rejects_total"] == len(bad)
    assert status["batches"] >= 2  # capped micro-batches: the join state carries across them
    assert status["end_offsets"] == {
        t: {str(p): 1 + max((r.offset for r in produced if (r.topic, r.partition) == (t, p)), default=-1)
            for p in (0, 1)}
        for t in (profiles_topic, settings_topic)}

    expected = expected_joined([r for r in produced if r.topic == profiles_topic],
                               [r for r in produced if r.topic == settings_topic])
    assert "m0000100" not in expected and expected[deleted.decode()]["name"] == "Back Again"
    assert any(row["language"] is None and row["settings_offset"] is None for row in expected.values())
    assert {r["member_id"]: r for r in job.table()} == expected

    positions = sorted((r.topic, r.partition, r.offset) for r in produced[-len(bad):])
    rejected = job.rejected()
    assert [(t, p, o) for t, p, o, _ in rejected] == positions
    assert {e.split(":")[0] for *_, e in rejected} == {
        "field 'name' is missing",
        "field 'visibility' is 'everyone', expected one of public, connections, private",
        "value is not JSON", "key is not UTF-8 (invalid continuation byte at byte 0)"}
