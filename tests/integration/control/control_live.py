"""The live setup of the control-plane integration tests: a compacted topic on the session's
Apache Kafka broker, a kappa home, real standardize jobs spawned by the orchestrator, a live producer.

Everything started here is stopped by PID in `Live.close()` (jobs killed by `tests.teardown.kill_jobs`, then any
process group left behind), which the fixtures call in their teardown.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.dev import datagen

from orchestrator.jobctl.health import CHILDREN
from orchestrator.core.settings import Settings
from orchestrator.context import Kappa
from orchestrator.core.pipelines import PipelineSpec
from tests.served import served_diff, version_diff
from tests.teardown import kill_jobs
from tests.waiting import wait_until

PIPELINE = "standardize"
PARTITIONS = 4
#: JVM start plus a backfill on 2 shared cores: generous, never relied upon for timing.
DEADLINE = float(os.environ.get("KAPPA_TEST_READY_DEADLINE", "900"))


def make_spec(topic: str, alias: str, **overrides) -> PipelineSpec:
    fields = dict(name=PIPELINE, job="standardize", topics=(topic,), key="member_id", ruleset="titles",
                  alias=alias, catchup_threshold=0, catchup_samples=2, grace_period_seconds=3600.0,
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
    #: Every record this setup produces derives from it (the `module_seed` or `seed` of the test).
    seed: int
    produced: int = 0
    _stop: threading.Event | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _live_count: list = field(default_factory=lambda: [0], repr=False)
    _batches: int = field(default=0, repr=False)

    @property
    def settings(self) -> Settings:
        return self.k.settings

    def next_seed(self) -> int:
        """A fresh seed for the next batch of records, derived from `seed` (so a rerun repeats it)."""
        self._batches += 1
        return (self.seed + 7919 * self._batches) % 2**31

    def produce(self, n: int, keys: int, *, first_new: bool = False) -> None:
        stats = datagen.produce(self.bootstrap, self.topic,
                                datagen.generate_changelog(n, keys, seed=self.next_seed(), first_new=first_new),
                                partitions=PARTITIONS)
        self.produced += stats.records

    def start_producer(self, rate: float = 15.0, keys: int = 600) -> None:
        assert self._thread is None, "the live producer already runs"
        self._stop = threading.Event()
        seed = self.next_seed()

        def run():
            self._live_count[0] += datagen.produce_live(self.bootstrap, self.topic, rate=rate, stop=self._stop,
                                                        keys=keys, seed=seed)

        self._thread = threading.Thread(target=run, name="live-producer", daemon=True)
        self._thread.start()

    def stop_producer(self) -> int:
        """Stop the live producer; returns how many records it sent in total."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(60)
            self._thread = None
        return self._live_count[0]

    def close(self) -> None:
        self.stop_producer()
        if self.k._registry is not None:
            try:
                kill_jobs(self.k, [PIPELINE])
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


def served_equals_expected(live: Live, rules_version: str, *, version: int | None = None) -> tuple[bool, str]:
    """(equal, explanation): the table the alias serves and the rejects of the version it serves,
    exactly against the oracle's table and rejects for the log as it is now; with `version`, that
    version's own table and rejects instead."""
    from orchestrator.serving import resolve_alias

    if version is not None:
        paths = live.k.paths(PIPELINE, version)
        why, rows = version_diff(paths.table, paths.rejects, live.bootstrap, live.topic, rules_version)
        return why is None, why or f"{rows} rows and the rejects equal"

    pointer = resolve_alias(live.alias, live.settings)
    rejects = live.k.paths(pointer["pipeline"], pointer["version"]).rejects
    why, rows = served_diff(live.settings, live.alias, live.bootstrap, live.topic, rules_version, rejects)
    return why is None, why or f"{rows} rows and the rejects equal"


def wait_exact(live: Live, what: str, *, version: int | None = None, each=None,
               catch: tuple[type[BaseException], ...] = ()) -> None:
    """Wait (up to `DEADLINE`) until `served_equals_expected(live, "v1", version=version)` holds, calling
    `each()` before every look; an exception in `catch` counts as not yet (a table its job has not
    written yet). A wait that ends unequal fails naming the last difference the oracle saw."""
    def look() -> tuple[bool, str]:
        if each is not None:
            each()
        try:
            return served_equals_expected(live, "v1", version=version)
        except catch as e:
            return False, f"{type(e).__name__}: {e}"
    wait_until(look, f"{what} to equal the oracle", DEADLINE, poll=1.0, done=lambda r: r[0])
