"""Fault scenario 3 (issue 33): the registry's PostgreSQL restarted in the middle of a promote and of a
rollback, at forced points: between the compare-and-swap of the flip and the publish of the pointer
(`promote.flipped`, `rollback.flipped`), and inside the transaction of a lag sample, before its commit
(`lag_sample.inserted`, the readiness check that precedes every flip).

Two faults at each point: the server restarted at once (stopped with a fast shutdown, which ends every
session, then started), and the server stopped and started only after the verb has given up. The verb
runs through the `kappa` CLI in-process against a private PostgreSQL (`private_postgres`; the
machine's server is never touched), with fake jobs and a fake Kafka log (no Spark, no broker: the
windows are the control plane's). The oracle, once the fault has healed:

- the verb either completed, or failed with one line on stderr (no traceback) that says the registry
  was unreachable and to retry, and then completes when run again;
- every version's state is a VersionState reached from its state before along the model's legal moves
  (`tests/unit/control/model_checks.py`), exactly one version serves, and it is the one the verb meant;
  the alias moved exactly once (one flip in the audit log, none lost, none repeated);
- after `kappa reconcile` the pointer file readers follow and the registry's alias agree, the flip is
  published, and the table read through the alias is exactly the served version's rows.
"""

from __future__ import annotations

import os
import uuid

import pytest

from orchestrator.context import Kappa
from orchestrator.core import crashpoints
from orchestrator.core.settings import resolve_settings
from tests.faults.fault_helpers import PIPELINES, Bed, verb_under_fault
from tests.faults.private_postgres import PrivatePostgres
from tests.unit.control.control_helpers import FakeLog, end_children

pytestmark = [pytest.mark.integration, pytest.mark.faults]


@pytest.fixture(scope="module")
def pg():
    server = PrivatePostgres()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def bed(pg, tmp_path, monkeypatch):
    for var in list(os.environ):
        if var.startswith("KAPPA_"):
            monkeypatch.delenv(var)
    url = pg.create_database(f"kappa_fault_{uuid.uuid4().hex[:10]}")
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(PIPELINES)
    home = tmp_path / "home"
    k = Kappa(resolve_settings(home=str(home), pipelines_file=str(pipelines), bootstrap_servers="127.0.0.1:9",
                               registry_url=url, env={}))
    try:
        yield Bed(k, home, pipelines, url, FakeLog({0: 100, 1: 50}).install(monkeypatch))
    finally:
        crashpoints.disarm()
        if pg.pid is None:        # a test that failed with the server down leaves it up for the next
            pg.start()
        end_children()
        k.close()


CASES = [
    # verb, point, fault
    ("promote", "promote.flipped", "restart"),
    ("promote", "promote.flipped", "down"),
    ("promote", "lag_sample.inserted", "restart"),
    ("rollback", "rollback.flipped", "restart"),
    ("rollback", "rollback.flipped", "down"),
    ("rollback", "lag_sample.inserted", "restart"),
]


@pytest.mark.parametrize("verb,point,fault", CASES, ids=[f"{v}-{p}-{f}" for v, p, f in CASES])
def test_registry_postgres_restarted_mid_verb(bed, pg, fault_row, verb, point, fault):
    def inject():
        pg.restart() if fault == "restart" else pg.stop()

    def heal():
        if pg.pid is None:
            pg.start()

    out = verb_under_fault(bed, verb, point, inject, heal, "registry", "unreachable", "retry")
    fault_row(scenario="registry PostgreSQL restarted", phase=verb,
              fault=f"{'restart' if fault == 'restart' else 'stop (start after the verb)'} at {point}",
              kappa=out.did, healed_s=out.seconds, exact=out.exact, consistent=out.consistent)
    assert not out.problems, out.problems
