"""A version's rejects are the rows of its rejects table, whether its job runs or not.

The job's `rejects` in status.json counts since its process started (0 right after a restart);
its `rejects_total` is the table's count, but only from its first micro-batch after the start.
Until then, and for a stopped job, `kappa status` and the metrics count the table itself.
"""

from __future__ import annotations

import json

import pyarrow as pa

from orchestrator.observe import lag as lag_mod
from orchestrator.observe.metrics import collect
from tests.unit.control.control_helpers import fake_running, write_table

P = "standardize"


def _no_broker(monkeypatch):
    monkeypatch.setattr(lag_mod, "log_offsets", lambda k, topics, timeout=10.0: {("member_profiles", 0): (0, 90)})
    monkeypatch.setattr(lag_mod, "group_offsets", lambda k, g, topics, timeout=10.0: {})
    monkeypatch.setattr(lag_mod, "checkpoint_next_offsets", lambda path: ({("member_profiles", 0): 90}, 4))


def _rejects(k, version: int, *batches: int) -> None:
    """The version's rejects table, one append per batch of `n` rows (one data file each)."""
    from deltalake import write_deltalake

    uri = str(k.paths(P, version).rejects)
    for i, n in enumerate(batches):
        write_deltalake(uri, pa.table({"key": [f"k{j}" for j in range(n)], "error": ["bad title"] * n}),
                        mode="append" if i else "overwrite")


def _rows(run) -> dict[int, dict]:
    return {v["version"]: v for v in json.loads(run("status", P, "--json").stdout)["pipelines"][0]["versions"]}


def test_a_restarted_job_shows_its_tables_rejects_not_the_count_since_its_start(run, seeded, monkeypatch):
    _no_broker(monkeypatch)
    seeded.registry.set_state(P, 1, "caught_up")
    seeded.registry.set_state(P, 1, "standby")             # a rollback restarted v1: no batch since
    _rejects(seeded, 1, 13, 8)
    fake_running(seeded, 1, P, rejects=0, rejects_total=None)
    rows = _rows(run)
    assert (rows[1]["rejects"], rows[1]["rejects_source"]) == (21, "table")
    assert (rows[2]["rejects"], rows[2]["rejects_source"]) == (0, "table")     # no table yet: none

    fake_running(seeded, 1, P, rejects=2, rejects_total=23)   # its first micro-batch since: the job's count
    assert (_rows(run)[1]["rejects"], _rows(run)[1]["rejects_source"]) == (23, "job")


def test_a_stopped_version_shows_its_tables_rejects(run, seeded):
    _rejects(seeded, 2, 5)
    assert _rows(run)[2]["rejects"] == 5


def test_the_rejects_metric_counts_the_rejects_table(seeded):
    _rejects(seeded, 1, 13, 8)
    fake_running(seeded, 1, P, state="stopped", rejects=0, rejects_total=None)
    figures = {(m.name, dict(m.labels).get("version")): m.value for m in collect(seeded, pipelines=[P])}
    assert figures[("kappa_rejects", "1")] == 21
    assert figures[("kappa_rejects", "2")] == 0


def test_count_rows_from_log_reads_the_file_statistics(tmp_path):
    from orchestrator.core.tables import count_rows_from_log

    assert count_rows_from_log(tmp_path / "none") == 0
    write_table_path = tmp_path / "t"
    write_table(write_table_path, pa.table({"x": [1, 2, 3]}))
    write_table(write_table_path, pa.table({"x": [4, 5]}))        # overwrite: the first file is removed
    assert count_rows_from_log(write_table_path) == 2
