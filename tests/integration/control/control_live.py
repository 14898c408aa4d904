"""The live setup of the control-plane integration tests: a compacted topic on the session's
tansu broker, a kappa home, real standardize jobs spawned by the orchestrator, a live producer.

Everything started here is stopped by PID in `Live.close()` (jobs by `stop_version`, then any
process group left behind), which the fixtures call in their teardown.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from orchestrator.dev import datagen

import orchestrator.jobctl as lifecycle
from orchestrator.jobctl.health import CHILDREN
from orchestrator.core.settings import Settings
from orchestrator.core.kappa import Kappa
from orchestrator.core.pipelines import PipelineSpec

PIPELINE = "standardize"
PARTITIONS = 4
#: JVM start plus a backfill on 2 shared cores: generous, never relied upon for timing.
DEADLINE = float(os.environ.get("KAPPA_TEST_READY_DEADLINE", "900"))


def make_spec(topic: str, alias: str, **overrides) -> PipelineSpec:
    fields = dict(name=PIPELINE, job="standardize", topics=(topic,), key="member_id", ruleset="titles",
                  alias=alias, catchup_threshold=0, catchup_samples=3, grace_period_seconds=3600.0,
                  keep_versions=2, key_count_tolerance=0.05, max_reject_rate=0.05, max_records_per_batch=5000)
    fields.update(overrides)
    return PipelineSpec(**fields)


@dataclass
class Live:
    bootstrap: str
    topic: str
    alias: str
    home: Path
    k: Kappa
    produced: int = 0
    _stop: threading.Event | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _live_count: list = field(default_factory=lambda: [0], repr=False)

    @property
    def settings(self) -> Settings:
        return self.k.settings

    def produce(self, n: int, keys: int, seed: int, *, first_new: bool = False) -> None:
        stats = datagen.produce(self.bootstrap, self.topic, datagen.generate_changelog(n, keys, seed=seed,
                                                                                      first_new=first_new),
                                partitions=PARTITIONS)
        self.produced += stats.records

    def start_producer(self, rate: float = 15.0, keys: int = 600) -> None:
        assert self._thread is None, "the live producer already runs"
        self._stop = threading.Event()

        def run():
            self._live_count[0] += datagen.produce_live(self.bootstrap, self.topic, rate=rate, stop=self._stop,
                                                        keys=keys, seed=int(time.time()) % 1000)

        self._thread = threading.Thread(target=run, name="live-producer", daemon=True)
        self._thread.start()

    def stop_producer(self) -> int:
        """Stop the live producer; returns how many records it sent in total."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(60)
            self._thread = None
        return self._live_count[0]

    def expected(self, rules_version: str) -> pa.Table:
        from jobs.lib.rules import load_rules, rules_path

        rules = load_rules(rules_path("titles", rules_version))
        return datagen.expected_table(datagen.iter_log(self.bootstrap, self.topic), rules).table

    def close(self) -> None:
        self.stop_producer()
        reg = self.k._registry
        if reg is not None:
            try:
                for rec in reg.list_versions(PIPELINE):
                    if lifecycle.inspect_version(self.k, PIPELINE, rec.version).alive:
                        lifecycle.stop_version(self.k, PIPELINE, rec.version, actor="teardown", force=True,
                                               graceful_timeout=30, term_timeout=15)
            except Exception as e:  # teardown goes on: the PIDs below are stopped regardless
                print(f"teardown: {e}")
        for pid, proc in list(CHILDREN.items()):
            if proc.poll() is None:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(10)
            CHILDREN.pop(pid, None)


def sorted_table(table: pa.Table, columns: list[str]) -> pa.Table:
    return table.select(columns).sort_by("member_id")


def served_equals_expected(live: Live, rules_version: str) -> tuple[bool, str]:
    """(equal, explanation) for the table the alias serves against the expected table from the log."""
    from orchestrator.serving import open_alias

    expected = live.expected(rules_version)
    served = open_alias(live.alias, live.settings).to_pyarrow_table()
    served = sorted_table(served, expected.column_names).cast(expected.schema)
    if served.equals(expected):
        return True, f"{served.num_rows} rows equal"
    exp_keys = set(expected["member_id"].to_pylist())
    got_keys = set(served["member_id"].to_pylist())
    diff = {"missing": sorted(exp_keys - got_keys)[:5], "extra": sorted(got_keys - exp_keys)[:5]}
    if not diff["missing"] and not diff["extra"]:
        for name in expected.column_names:
            if not served[name].equals(expected[name]):
                rows = [i for i, (a, b) in enumerate(zip(served[name].to_pylist(), expected[name].to_pylist()))
                        if a != b][:3]
                diff[name] = [(served["member_id"][i].as_py(), served[name][i].as_py(), expected[name][i].as_py())
                              for i in rows]
    return False, f"served {served.num_rows} rows, expected {expected.num_rows}: {diff}"
