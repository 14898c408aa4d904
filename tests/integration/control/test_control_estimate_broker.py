"""The backfill estimate on the real stack (issue 32): the session's Apache Kafka broker, real standardize jobs.

v1 is deployed over a compacted topic with no earlier version: its estimate has the default rate, said so;
once its backfill batch commits, readiness keeps the measured backfill beside it. `kappa deploy --dry-run`,
a separate process, then prints the log's size per topic (records from the offsets, bytes from Kafka's
LogDirsCommand) and an estimate at the rate measured on v1. v2's deploy stores that estimate, and after its
backfill the actual is recorded beside it and `kappa status` shows both with their ratio. No time is
asserted: the ratio is printed, the structure checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from control_live import DEADLINE, PARTITIONS, PIPELINE
from orchestrator.context import Kappa
from orchestrator.core.settings import Settings
from orchestrator.dev import datagen
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote
from orchestrator.observe.estimate import compare
from tests.teardown import kill_jobs
from tests.shell import users_env

pytestmark = pytest.mark.integration

RECORDS, KEYS = 20_000, 2_000


def _kappa(home, bootstrap, pipelines, *args: str) -> subprocess.CompletedProcess:
    env = users_env()
    env["KAPPA_PIPELINES"] = str(pipelines)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "--home", str(home), "--bootstrap-servers",
                           bootstrap, *args], capture_output=True, text=True, timeout=300, env=env)


def test_the_second_version_is_estimated_at_the_first_one_s_measured_rate_and_its_actual_kept_beside(
        bootstrap, tmp_path, seed):
    unique = uuid.uuid4().hex[:8]
    topic, alias = f"estimate_{unique}", f"estimate_std_{unique}"
    datagen.ensure_topic(bootstrap, topic, PARTITIONS)
    datagen.produce(bootstrap, topic, datagen.generate_changelog(RECORDS, KEYS, seed=seed), partitions=PARTITIONS)
    home = tmp_path / "home"
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(f"""
[pipelines.{PIPELINE}]
job = "standardize"
topics = ["{topic}"]
key = "member_id"
ruleset = "titles"
alias = "{alias}"
catchup_threshold = 0
catchup_samples = 2
key_count_tolerance = 0.05
max_reject_rate = 0.05
""")
    k = Kappa(Settings(home=home, bootstrap_servers=bootstrap, pipelines_file=pipelines))
    try:
        v1 = deploy(k, k.pipeline(PIPELINE), "v1", actor="tests", reason="first, nothing measured yet")
        assert v1.estimate is not None and v1.estimate.known and v1.estimate.from_version is None
        assert v1.estimate.records == RECORDS and v1.estimate.topics[0].partitions == PARTITIONS
        assert v1.estimate.rate_source.endswith("no earlier version measured")
        assert wait_ready(k.version(PIPELINE, v1.version), deadline_seconds=DEADLINE, poll_seconds=1).ready
        d1 = k.registry.get_version(PIPELINE, v1.version).details
        assert d1["backfill"]["offsets"] == RECORDS and d1["backfill"]["batch_seconds"] > 0
        assert d1["backfill"]["seconds"] >= d1["backfill"]["batch_seconds"]
        assert sum(int(o) for o in d1["backfill"]["end_offsets"][topic].values()) == RECORDS
        print("v1:", json.dumps(compare(d1["estimate"], d1["backfill"])))
        promote(k.version(PIPELINE, v1.version), actor="tests", reason="v1 serves")

        text = _kappa(home, bootstrap, pipelines, "deploy", PIPELINE, "--rules", "v2", "--dry-run")
        assert text.returncode == 0, text.stderr
        print(text.stdout)
        assert f"dry run: would deploy {PIPELINE} v2" in text.stdout
        assert f"measured on v{v1.version}'s backfill: {RECORDS:,} records in" in text.stdout
        assert f"  topic {topic}: {PARTITIONS} partitions, {RECORDS:,} records, " in text.stdout
        assert "  bytes: the partitions' segment sizes" in text.stdout
        as_json = json.loads(_kappa(home, bootstrap, pipelines, "deploy", PIPELINE, "--rules", "v2", "--dry-run",
                                    "--json").stdout)["estimate"]
        assert (as_json["known"], as_json["bytes_source"], as_json["from_version"]) == (True, "log-dirs", v1.version)
        assert as_json["bytes"] > 0 and as_json["cores"] == 2

        v2 = deploy(k, k.pipeline(PIPELINE), "v2", actor="tests", reason="second, at v1's measured rate")
        # a deploy samples the records' size; the dry run above asked the broker's segment sizes
        assert v2.estimate.from_version == v1.version and v2.estimate.bytes_source == "sampled"
        assert wait_ready(k.version(PIPELINE, v2.version), deadline_seconds=DEADLINE, poll_seconds=1).ready
        d2 = k.registry.get_version(PIPELINE, v2.version).details
        assert d2["estimate"]["from_version"] == v1.version and d2["backfill"]["offsets"] == RECORDS
        assert d2["backfill"]["bytes"] == d2["estimate"]["bytes"]
        c = compare(d2["estimate"], d2["backfill"])
        print("v2:", json.dumps(c))
        assert c is not None and c["ratio"] > 0 and isinstance(c["within_goal"], bool)

        status = _kappa(home, bootstrap, pipelines, "status", PIPELINE)
        assert status.returncode == 0, status.stderr
        print(status.stdout)
        assert f"{PIPELINE} v{v2.version} backfill: estimate " in status.stdout
        assert f"of the estimate, {'within' if c['within_goal'] else 'outside'} 25%" in status.stdout
        rows = json.loads(_kappa(home, bootstrap, pipelines, "status", PIPELINE, "--json").stdout)
        row = next(v for v in rows["pipelines"][0]["versions"] if v["version"] == v2.version)
        assert row["estimate_vs_actual"] == c
    finally:
        kill_jobs(k, [PIPELINE])
        k.close()
