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

import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.context import Kappa
from orchestrator.core import crashpoints
from orchestrator.core.settings import resolve_settings
from orchestrator.core.states import VersionState
from orchestrator.core.tables import read_table
from orchestrator.lifecycle.promote import promote
from orchestrator.serving import open_alias, read_pointer
from tests.faults.private_postgres import PrivatePostgres
from tests.unit.control.control_helpers import ALIAS, PIPELINE, FakeLog, end_children, profiles, ready_version
from tests.unit.control.model_checks import legal_move

pytestmark = [pytest.mark.integration, pytest.mark.faults]

PIPELINES = f"""
[pipelines.{PIPELINE}]
job = "standardize"
topics = ["orders"]
key = "member_id"
alias = "{ALIAS}"
catchup_threshold = 0
catchup_samples = 3
grace_period_seconds = 3600
keep_versions = 2
key_count_tolerance = 0.1
max_reject_rate = 0.05
"""
ROWS = {1: [("m1", "swe", "SWE", "Ada", 1), ("m2", "pm", "PM", "Grace", 2), ("m3", "sre", "SRE", "Alan", 3)],
        2: [("m1", "swe", "Software Engineer", "Ada", 1), ("m2", "pm", "Product Manager", "Grace", 2),
            ("m3", "sre", "Site Reliability Engineer", "Alan", 3)]}


@pytest.fixture(scope="module")
def pg():
    server = PrivatePostgres()
    try:
        server.start()
        yield server
    finally:
        server.close()


@dataclass
class Bed:
    k: Kappa
    home: Path
    pipelines_file: Path
    url: str
    pg: PrivatePostgres
    fake_log: FakeLog
    states_before: dict[int, str] = field(default_factory=dict)

    def run(self, *args: str):
        from orchestrator.cli import app

        argv = ["--home", str(self.home), "--pipelines-file", str(self.pipelines_file), "--registry-url", self.url,
                "--bootstrap-servers", "127.0.0.1:9", *args]
        # catch_exceptions=False: a traceback (anything but a one-line KappaError) fails the test as it is
        return CliRunner().invoke(app, argv, catch_exceptions=False)


@pytest.fixture
def bed(pg, tmp_path, monkeypatch):
    import os

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
        yield Bed(k, home, pipelines, url, pg, FakeLog({0: 100, 1: 50}).install(monkeypatch))
    finally:
        crashpoints.disarm()
        if pg.pid is None:        # a test that failed with the server down leaves it up for the next
            pg.start()
        end_children()
        k.close()


def _serving_v1_then_v2_ready(bed: Bed, *, v2_serves: bool) -> None:
    """v1 promoted; v2 caught up (and promoted, with v1 a running standby, when `v2_serves`)."""
    v1 = ready_version(bed.k, bed.fake_log, ROWS[1])
    promote(bed.k.version(PIPELINE, v1), actor="setup", reason="v1 serves")
    v2 = ready_version(bed.k, bed.fake_log, ROWS[2])
    assert (v1, v2) == (1, 2)
    if v2_serves:
        promote(bed.k.version(PIPELINE, v2), actor="setup", reason="v2 serves, v1 standby")
    bed.states_before = {r.version: str(r.state) for r in bed.k.registry.list_versions(PIPELINE)}


def _flips(bed: Bed) -> list:
    return [e for e in bed.k.registry.audit_log(PIPELINE, limit=None, action="flip_alias") if e.outcome == "ok"]


def _oracle(bed: Bed, served: int) -> tuple[bool, bool, list[str]]:
    """(served table exact, registry consistent, what disagrees) after the fault healed and reconcile ran."""
    problems: list[str] = []
    reg = bed.k.registry
    alias = reg.get_alias(ALIAS)
    pointer = read_pointer(bed.k.alias_file(ALIAS))
    table = str(bed.k.paths(PIPELINE, served).table)
    if alias is None or (alias.version, alias.published_version) != (served, served):
        problems.append(f"the registry's alias is {alias and (alias.version, alias.published_version)}, not "
                        f"v{served} published")
    if not pointer or (pointer.get("version"), pointer.get("table")) != (served, table):
        problems.append(f"the pointer file holds {pointer}, not v{served} at {table}")
    states = {r.version: str(r.state) for r in reg.list_versions(PIPELINE)}
    legal = {s.value for s in VersionState}
    for v, s in states.items():
        if s not in legal or not legal_move(bed.states_before.get(v, "created"), s, flip_ends_path=False):
            problems.append(f"v{v} went {bed.states_before.get(v)} -> {s}, not a move the model allows")
    if [v for v, s in states.items() if s == "serving"] != [served]:
        problems.append(f"serving: {states} (expected v{served} alone)")
    consistent = not problems
    rows = read_table(open_alias(ALIAS, bed.k.settings)).sort_by("member_id")
    exact = rows.equals(profiles(ROWS[served]).sort_by("member_id"))
    if not exact:
        problems.append(f"the served table is {rows.to_pylist()}, not v{served}'s rows")
    return exact, consistent, problems


def _one_line_registry_error(result) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in result.output, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), f"not one error line: {result.stderr!r}"
    line = lines[0]
    assert "unreachable" in line and "retry" in line, f"the error does not say the registry was unreachable and to " \
                                                      f"retry: {line}"
    return line


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
def test_registry_postgres_restarted_mid_verb(bed, fault_row, verb, point, fault):
    _serving_v1_then_v2_ready(bed, v2_serves=verb == "rollback")
    served = 2 if verb == "promote" else 1
    args = ["promote", PIPELINE, "2"] if verb == "promote" else ["rollback", PIPELINE]
    flips_before = len(_flips(bed))
    injected: list[float] = []

    def inject():
        if injected:
            return
        injected.append(time.monotonic())
        bed.pg.restart() if fault == "restart" else bed.pg.stop()

    crashpoints.hook(point, inject)
    first = bed.run(*args, "--actor", "fault-test", "--reason", f"{point} {fault}")
    crashpoints.disarm()
    assert injected, f"the verb never reached {point}"
    if first.exit_code == 0:
        did = "completed"
    else:
        line = _one_line_registry_error(first)
        if bed.pg.pid is None:
            bed.pg.start()
        again = bed.run(*args, "--actor", "fault-test", "--reason", f"retry after {point} {fault}")
        assert again.exit_code == 0, f"the retry did not complete: {again.output}"
        print(f"\n{verb} at {point} ({fault}): {line}")
        what = re.search(r"is unreachable: (.+?) failed", line)
        did = f"failed in one line (registry unreachable: {what.group(1) if what else line}), completed on retry"
    rec = bed.run("reconcile", "--actor", "fault-test")
    assert rec.exit_code == 0, rec.output
    exact, consistent, problems = _oracle(bed, served)
    healed = time.monotonic() - injected[0]
    flips = _flips(bed)[flips_before:]
    if [(e.details or {}).get("to_version") for e in flips] != [served]:
        consistent = False
        problems.append(f"the alias moved {len(flips)} times: {[(e.details or {}) for e in flips]}")
    fault_row(scenario="registry PostgreSQL restarted", phase=verb,
              fault=f"{'restart' if fault == 'restart' else 'stop, start after the verb'} at {point}",
              kappa=did, healed_s=healed, exact=exact, consistent=consistent)
    assert not problems, problems
