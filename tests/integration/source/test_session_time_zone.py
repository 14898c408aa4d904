"""A kappa JVM runs in UTC on a machine in another zone, so delta-spark does not replay a table's log
again after each of its commits.

delta-spark verifies the whole file list of a table against its checksum after every commit when the
JVM's default zone is not UTC (`Snapshot.allFilesInCrcVerificationForceEnabled`): one more Spark job
and about 0.4 s per live MERGE (`TZ=America/New_York kappa bench upsert`: 11 -> 12 Spark jobs per batch
before the fix). The session here is started in a child process whose environment puts the machine in
New York, as a data team's laptop would be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
PROBE = """
import json
from jobs.lib.runtime.session import build_session
spark = build_session("kappa-tz-probe", master="local[1]", short_lived=True)
jvm = spark._jvm
print("PROBE " + json.dumps({
    "jvm_zone": jvm.java.util.TimeZone.getDefault().getID(),
    "session_zone": spark.conf.get("spark.sql.session.timeZone"),
    "delta_verifies_every_commit": getattr(getattr(jvm.org.apache.spark.sql.delta, "Snapshot$"), "MODULE$")
        .allFilesInCrcVerificationForceEnabled(spark._jsparkSession),
}))
spark.stop()
"""


def test_a_session_on_a_machine_in_new_york_runs_its_jvm_in_utc(tmp_path):
    env = {**os.environ, "TZ": "America/New_York",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=180)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("PROBE ")]
    assert run.returncode == 0 and lines, run.stderr[-2000:]
    probe = json.loads(lines[-1][len("PROBE "):])
    assert probe == {"jvm_zone": "UTC", "session_zone": "UTC", "delta_verifies_every_commit": False}, probe
