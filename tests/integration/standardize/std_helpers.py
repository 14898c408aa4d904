"""Helpers of the standardize integration tests: the produced changelog, job paths, job runners."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobs.lib.rules.files import load_rules, rules_path
from orchestrator.dev.datagen import LogRecord, ensure_topic, generate_changelog, iter_log, produce
from tests.oracle.standardize import Expected, expected_table

V1 = load_rules(rules_path("titles", "v1"))
V2 = load_rules(rules_path("titles", "v2"))


@dataclass
class Changelog:
    topic: str
    log: list[LogRecord]

    def expected(self, rules_version: str) -> Expected:
        """The tests' own expected table and rejects (tests/oracle), for rules "v1" or "v2"."""
        return expected_table(self.log, rules_version)


def make_changelog(bootstrap: str, unique: str, seed: int) -> Changelog:
    """A 4-partition compacted topic with creates, updates, deletes, malformed records and unicode."""
    topic = f"profiles_{unique}"
    ensure_topic(bootstrap, topic, partitions=4)
    stats = produce(bootstrap, topic, generate_changelog(4000, 1000, seed=seed, malformed_share=0.04,
                                                          delete_share=0.06))
    assert stats.records == 4000 and stats.by_kind["tombstone"] > 50
    log = list(iter_log(bootstrap, topic))
    assert len(log) == 4000
    return Changelog(topic, log)


@dataclass
class JobPaths:
    root: Path

    @property
    def output(self) -> Path:
        return self.root / "warehouse" / "standardize" / "v1"

    @property
    def rejects(self) -> Path:
        return self.root / "warehouse" / "standardize" / "v1__rejects"

    @property
    def checkpoint(self) -> Path:
        return self.root / "state" / "standardize" / "v1" / "checkpoint"

    @property
    def run_dir(self) -> Path:
        return self.root / "state" / "standardize" / "v1" / "run"

    def args(self, bootstrap: str, topic: str, rules: Path, max_records: int = 1500) -> Namespace:
        return Namespace(pipeline="standardize", version=1, bootstrap_servers=bootstrap, topics=topic,
                         output=str(self.output), rejects=str(self.rejects), checkpoint=str(self.checkpoint),
                         run_dir=str(self.run_dir), group_id=f"kappa.standardize.v1.{topic}", rules=str(rules),
                         max_records_per_batch=max_records)

    def argv(self, bootstrap: str, topic: str, rules: Path, max_records: int = 1500) -> list[str]:
        a = self.args(bootstrap, topic, rules, max_records)
        return ["--pipeline", a.pipeline, "--version", str(a.version), "--bootstrap-servers", bootstrap,
                "--topics", topic, "--output", a.output, "--rejects", a.rejects, "--checkpoint", a.checkpoint,
                "--run-dir", a.run_dir, "--group-id", a.group_id, "--rules", a.rules,
                "--max-records-per-batch", str(max_records), "--trigger", "available-now", "--master", "local[2]",
                "--job", "jobs.standardize:transform", "--key", "member_id"]


def commits(uri) -> list[dict]:
    """The kappa metadata (Delta userMetadata) of every commit of a table that has some, oldest first."""
    from deltalake import DeltaTable

    out = []
    for h in reversed(DeltaTable(str(uri)).history()):
        meta = json.loads(h.get("userMetadata") or "null")
        if isinstance(meta, dict) and "batch_id" in meta:
            out.append(meta)
    return out


def read_sorted(uri):
    """A Delta table's live rows (deletion vectors honoured), sorted by member id."""
    from orchestrator.core.tables import read_table

    return read_table(uri).sort_by("member_id")


def run_job_process(argv: list[str], log_path: Path, env: dict | None = None, timeout: float = 900):
    """`python -m jobs.run ...` (the standardize job: `JobPaths.argv`) to its end, output in `log_path`;
    returns (exit code, log text)."""
    from jobs.lib.runtime.session import spark_env

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "jobs.run", *argv], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **spark_env(), **(env or {})})
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
            pytest.fail(f"the standardize job did not finish within {timeout:.0f}s; log {log_path}")
    return code, log_path.read_text(encoding="utf-8", errors="replace")


def run_in_process(spark, bootstrap: str, topic: str, args: Namespace, rules, *, max_records: int = 1500,
                   source: dict | None = None, min_partitions: int = 2, **kw):
    """The standardize query (the job's own `start_query`) on the shared session, available-now,
    driven to its end; returns its foreachBatch function (timings, skipped batches). The source's
    options are the job's (`kafka_options`, with `min_partitions` for the cores): `source`, else the
    ``source_options`` of ``args.extra``."""
    from jobs.lib.runtime.stream import kafka_options
    from jobs.standardize import start_query

    if source is None:
        source = (getattr(args, "extra", None) or {}).get("source_options")
    options = kafka_options(bootstrap, topic, max_offsets_per_trigger=max_records, min_partitions=min_partitions,
                            overrides=source)
    query, writer = start_query(spark, args, rules, options, {"availableNow": True}, **kw)
    try:
        query.awaitTermination()
    finally:
        if query.isActive:
            query.stop()
    assert query.exception() is None, query.exception()
    return writer
