"""Upkeep of a version's tables between micro-batches: OPTIMIZE, then VACUUM. Runs on the driver.

A live job commits a small MERGE (deletion vectors: rows marked, not files rewritten) or append
every micro-batch, so its tables gather small files and deletion vectors. Every
``optimize_every`` committed batches (default 100; 0: never) the job compacts its output and rejects
tables (``OPTIMIZE``: small files and files with many deleted rows rewritten into larger ones),
then VACUUMs them (``LITE``: the files the log recorded as removed, no listing): data files that the table stopped referencing more than
``vacuum_retention_hours`` ago (default 168, Delta's own) are deleted. A reader holds a snapshot's
files open only while it reads; a snapshot of the served or the standby table is never older than
the retention, so no file that a reader may still open is deleted (lowering it below one hour is
refused). Delta writes a checkpoint of the log every 10 commits by itself
(``delta.checkpointInterval``).

The upkeep runs inside foreachBatch after the batch's commits, so it never races the job's own
writes; a failed upkeep is logged and retried at the next interval, never failing the job. Options
(``[pipelines.<name>.options] upkeep = {optimize_every = 100, vacuum_retention_hours = 168}``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from orchestrator.core.exceptions import ConfigError

__all__ = ["Upkeep", "DEFAULT_OPTIMIZE_EVERY", "DEFAULT_RETENTION_HOURS", "MIN_RETENTION_HOURS"]

DEFAULT_OPTIMIZE_EVERY = 100
DEFAULT_RETENTION_HOURS = 168.0
MIN_RETENTION_HOURS = 1.0
_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
_LISTING = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


def _number(options: dict, name: str, default: float, minimum: float, what: str) -> float:
    raw = options.get(name, default)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw < minimum:
        raise ConfigError(f"--extra: upkeep option {name!r} must be {what}, got {raw!r}; set it in "
                          f"[pipelines.<name>.options] upkeep = {{{name} = ...}}")
    return raw


class Upkeep:
    """OPTIMIZE and VACUUM of `table_uris` every `optimize_every` batches (see the module)."""

    KNOWN = ("optimize_every", "vacuum_retention_hours")

    def __init__(self, table_uris: list[str], *, optimize_every: int = DEFAULT_OPTIMIZE_EVERY,
                 retention_hours: float = DEFAULT_RETENTION_HOURS, log: logging.Logger | None = None):
        self.table_uris = [u for u in table_uris if u]
        self.optimize_every = int(optimize_every)
        self.retention_hours = float(retention_hours)
        self.log = log or logging.getLogger("kappa.upkeep")
        self.batches = 0
        self.runs: list[dict[str, Any]] = []

    @classmethod
    def from_options(cls, table_uris: list[str], options: Any, log: logging.Logger | None = None) -> "Upkeep":
        """From the ``upkeep`` job option (a table); ConfigError naming a bad or unknown setting."""
        options = options if options is not None else {}
        if not isinstance(options, dict):
            raise ConfigError(f"--extra: upkeep must be a table such as {{optimize_every = 100}}, got {options!r}")
        unknown = sorted(set(options) - set(cls.KNOWN))
        if unknown:
            raise ConfigError(f"--extra: unknown upkeep option(s) {', '.join(map(repr, unknown))}; known: "
                              f"{', '.join(cls.KNOWN)}")
        every = _number(options, "optimize_every", DEFAULT_OPTIMIZE_EVERY, 0, "a whole number of micro-batches "
                        ">= 0 (0: never)")
        if every != int(every):
            raise ConfigError(f"--extra: upkeep option 'optimize_every' must be a whole number of micro-batches, "
                              f"got {every!r}")
        hours = _number(options, "vacuum_retention_hours", DEFAULT_RETENTION_HOURS, MIN_RETENTION_HOURS,
                        f"a number of hours >= {MIN_RETENTION_HOURS:g} (files a reader may still open are kept "
                        f"that long)")
        return cls(table_uris, optimize_every=int(every), retention_hours=hours, log=log)

    def after_batch(self, spark: Any) -> None:
        """Count a committed batch; every `optimize_every`-th, OPTIMIZE and VACUUM the tables."""
        self.batches += 1
        if self.optimize_every and self.batches % self.optimize_every == 0:
            self.run(spark)

    def _vacuum(self, spark: Any, uri: str) -> None:
        """VACUUM ... LITE: the files the log says were removed (no listing of the table's folder); a
        full VACUUM when the log no longer covers the last one, listing with as many tasks as cores
        (Spark's default of 10,000 listing tasks took a minute on a table of four files)."""
        path = uri.replace("`", "``")
        from jobs.lib.runtime.session import session_settings

        check = str(self.retention_hours >= DEFAULT_RETENTION_HOURS).lower()
        with session_settings(spark, {_CHECK: check, _LISTING: None}):
            try:
                spark.sql(f"VACUUM delta.`{path}` RETAIN {self.retention_hours:g} HOURS LITE").collect()
            except Exception as e:  # noqa: BLE001 - LITE needs the log since the last VACUUM
                self.log.info("VACUUM LITE of %s not possible (%s): a full VACUUM", uri,
                              str(e).splitlines()[0] if str(e) else type(e).__name__)
                spark.conf.set(_LISTING, str(max(1, spark.sparkContext.defaultParallelism)))
                spark.sql(f"VACUUM delta.`{path}` RETAIN {self.retention_hours:g} HOURS").collect()

    def run(self, spark: Any) -> None:
        from delta.tables import DeltaTable

        for uri in self.table_uris:
            t0 = time.perf_counter()
            try:
                if not DeltaTable.isDeltaTable(spark, uri):
                    continue
                table = DeltaTable.forPath(spark, uri)
                metrics = table.optimize().executeCompaction().select("metrics.*").first()
                self._vacuum(spark, uri)
            except Exception as e:  # noqa: BLE001 - upkeep never fails the job: the next interval retries
                self.log.warning("upkeep of %s failed (retried after %d more micro-batches): %s", uri,
                                 self.optimize_every, str(e).splitlines()[0] if str(e) else type(e).__name__)
                continue
            run = {"table": uri, "seconds": round(time.perf_counter() - t0, 3),
                   "files_removed": int(metrics["numFilesRemoved"] or 0),
                   "files_added": int(metrics["numFilesAdded"] or 0)}
            self.runs.append(run)
            self.log.info("upkeep of %s: OPTIMIZE compacted %d files into %d, VACUUM (retention %g h) in %.1f s",
                          uri, run["files_removed"], run["files_added"], self.retention_hours, run["seconds"])
