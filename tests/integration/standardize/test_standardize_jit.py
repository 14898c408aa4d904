"""A live job's JIT: C2 compiles a backfill's per-record code, and is left out once the batches are small
(`jobs.lib.runtime.session.leave_to_c1`, called by `jobs.lib.sink.batches.MicroBatches`)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest
from std_helpers import V2, run_in_process

from jobs.lib.rules.files import rules_path
from jobs.lib.runtime.session import leave_to_c1
from orchestrator.core.envvars import KAPPA_SPARK_JIT

pytestmark = pytest.mark.integration

FULL_JIT_JVM = """
from jobs.lib.runtime.session import leave_to_c1
from jobs.lib.runtime.session import build_session

spark = build_session("kappa-jit-test", "local[1]")
before = str(spark._jvm.kappa.jvm.Jit.directives())
print("FIRST", leave_to_c1(spark))
print("SECOND", leave_to_c1(spark))
after = str(spark._jvm.kappa.jvm.Jit.directives())
print("C2_BEFORE", before.split("c2 directives:", 1)[1].split("Exclude:", 1)[1].split()[0])
print("C2_AFTER", after.split("c2 directives:", 1)[1].split("Exclude:", 1)[1].split()[0])
spark.stop()
"""


def test_a_full_jit_jvm_leaves_c2_out_once_and_a_c1_only_one_is_left_alone(spark):
    """In a JVM with the full JIT, the directive excludes C2 (HotSpot's own print of its directives
    says so), once; the suite's shared session runs C1 only (`KAPPA_SPARK_JIT=quick`), so it is not
    changed."""
    from jobs.lib.runtime.session import spark_env

    env = {**os.environ, **spark_env(), KAPPA_SPARK_JIT: "full"}
    out = subprocess.run([sys.executable, "-c", FULL_JIT_JVM], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert lines["FIRST"] == "C2 left out of the JIT from now on (HotSpot: 1 compiler directives added)", lines
    assert lines["SECOND"] == "None", lines                  # once per JVM
    assert (lines["C2_BEFORE"], lines["C2_AFTER"]) == ("false", "true"), lines
    assert os.environ[KAPPA_SPARK_JIT] == "quick"            # the suite's session: C1 only, nothing to leave out
    assert leave_to_c1(spark) is None


def test_the_jit_is_settled_after_the_first_live_batch_not_after_the_backfill(spark, bootstrap, paths, unique, seed,
                                                                             monkeypatch, caplog):
    """Batch 0 (the backfill) keeps the JIT; each small batch after it asks to settle it (done once per JVM:
    the first answer is what was done, the later ones None), and the job says so once."""
    from jobs.lib.sink import batches
    from orchestrator.dev.datagen import ensure_topic, generate_changelog, produce

    calls = []

    def settle(session):
        calls.append(session)
        return "C2 left out (recorded by the test)" if len(calls) == 1 else None
    monkeypatch.setattr(batches, "leave_to_c1", settle)
    topic = f"profiles_jit_{unique}"
    ensure_topic(bootstrap, topic, partitions=2)
    produce(bootstrap, topic, list(generate_changelog(600, 200, seed=seed, malformed_share=0.0)))
    args = paths.args(bootstrap, topic, rules_path("titles", "v2"))
    args.extra = {"backfill": "capped"}
    with caplog.at_level(logging.INFO, logger="kappa.job"):
        writer = run_in_process(spark, bootstrap, topic, args, V2, max_records=300)
    batch_ids = [t["batch_id"] for t in writer.timings]
    assert batch_ids[:2] == [0, 1], batch_ids
    assert len(calls) == len(batch_ids) - 1 and all(c is not None for c in calls)   # every batch but the backfill
    said = [r.getMessage() for r in caplog.records if "was a live one" in r.getMessage()]
    assert len(said) == 1 and re.fullmatch(r"micro-batch 1 was a live one \(\d+ records at most\): C2 left out "
                                           r"\(recorded by the test\)", said[0]), said
