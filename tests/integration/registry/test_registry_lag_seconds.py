"""Schema steps 4 and 5: lag in seconds, and the job's committed micro-batches, on lag samples, on SQLite and
PostgreSQL."""

from __future__ import annotations

import math

import pytest
import sqlalchemy as sa
from registry_helpers import allocate

from orchestrator.core.exceptions import RegistryError
from orchestrator.registry import HEAD, Registry

pytestmark = pytest.mark.integration


def test_step_3_registry_gains_lag_seconds_and_keeps_its_samples(registry_url):
    old = Registry(registry_url, auto_migrate=False)
    try:
        assert old.migrate(target=3) == [1, 2, 3]
        allocate(old)
        old.add_lag_sample("standardize", 1, 5, {"member_profiles:0": 5}, at=100.0)
        assert "lag_seconds" not in {c["name"] for c in sa.inspect(old._engine).get_columns("lag_samples")}
    finally:
        old.close()
    reg = Registry(registry_url)  # migrates on open
    try:
        assert (reg.schema_version(), HEAD) == (5, 5)
        (before,) = reg.lag_samples("standardize", 1)
        assert (before.total, before.lag_seconds) == (5, None)      # unknown: never measured
        reg.add_lag_sample("standardize", 1, 0, {}, at=101.0, lag_seconds=2.5)
        reg.add_lag_sample("standardize", 1, 3, {}, at=99.0)         # without lag_seconds: unknown
        assert [(s.total, s.lag_seconds) for s in reg.lag_samples("standardize", 1)] == \
            [(3, None), (5, None), (0, 2.5)]
        newest = reg.latest_lag_samples()
        assert list(newest) == [("standardize", 1)] and newest[("standardize", 1)].total == 3  # newest by id
        assert reg.latest_lag_samples(["other"]) == {}
        reg.audit("restart", actor="sup", pipeline="standardize", version=1, outcome="ok")
        assert reg.audit_counts(["restart"]) == {("restart", "ok", "standardize"): 1}
        for bad in (-1.0, math.inf, "3"):
            with pytest.raises(RegistryError, match="lag in seconds must be a finite number >= 0 or None"):
                reg.add_lag_sample("standardize", 1, 0, {}, lag_seconds=bad)
        assert len(reg.lag_samples("standardize", 1)) == 3
        assert reg.migrate() == []
    finally:
        reg.close()


def test_step_4_registry_gains_the_batches_of_a_sample_and_keeps_its_samples(registry_url):
    old = Registry(registry_url, auto_migrate=False)
    try:
        assert old.migrate(target=4) == [1, 2, 3, 4]
        allocate(old)
        old.add_lag_sample("standardize", 1, 5, {"member_profiles:0": 5}, at=100.0, lag_seconds=1.5)
        assert "batches" not in {c["name"] for c in sa.inspect(old._engine).get_columns("lag_samples")}
    finally:
        old.close()
    reg = Registry(registry_url)  # migrates on open
    try:
        assert reg.schema_version() == HEAD == 5
        reg.add_lag_sample("standardize", 1, 0, {}, at=101.0, lag_seconds=0.0, batches=3)
        assert [(s.total, s.lag_seconds, s.batches) for s in reg.lag_samples("standardize", 1)] == \
            [(5, 1.5, None), (0, 0.0, 3)]                               # an older sample's batches: unknown
        for bad in (-1, 1.5, True):
            with pytest.raises(RegistryError, match="batches of a lag sample must be an integer >= 0 or None"):
                reg.add_lag_sample("standardize", 1, 0, {}, batches=bad)
        assert reg.migrate() == []
    finally:
        reg.close()
