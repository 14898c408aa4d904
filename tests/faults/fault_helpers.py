"""What the fault scenarios on the control plane share: a pipeline on a fake log with fake jobs (no
broker, no Spark), the `kappa` CLI run in-process against it, and the oracle on the served table and
the registry once a fault has healed."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from typer.testing import CliRunner

from orchestrator.context import Kappa
from orchestrator.core import crashpoints
from orchestrator.core.states import VersionState
from orchestrator.core.tables import read_table
from orchestrator.lifecycle.promote import promote
from orchestrator.serving import open_alias, read_pointer
from tests.unit.control.control_helpers import ALIAS, PIPELINE, FakeLog, profiles, ready_version
from tests.unit.control.model_checks import legal_move

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


@dataclass
class Bed:
    k: Kappa
    home: Path
    pipelines_file: Path
    url: str
    fake_log: FakeLog
    states_before: dict[int, str] = field(default_factory=dict)

    def run(self, *args: str):
        """`kappa <args>` in-process, with the same home, pipelines, registry and warehouse as `k`."""
        from orchestrator.cli import app

        argv = ["--home", str(self.home), "--pipelines-file", str(self.pipelines_file), "--registry-url", self.url,
                "--warehouse", str(self.k.settings.warehouse), "--bootstrap-servers", "127.0.0.1:9", *args]
        # catch_exceptions=False: a traceback (anything but a one-line KappaError) fails the test as it is
        return CliRunner().invoke(app, argv, catch_exceptions=False)


def serving_v1_then_v2_ready(bed: Bed, *, v2_serves: bool) -> None:
    """v1 promoted; v2 caught up (and promoted, with v1 a running standby, when `v2_serves`)."""
    v1 = ready_version(bed.k, bed.fake_log, ROWS[1])
    promote(bed.k.version(PIPELINE, v1), actor="setup", reason="v1 serves")
    v2 = ready_version(bed.k, bed.fake_log, ROWS[2])
    assert (v1, v2) == (1, 2)
    if v2_serves:
        promote(bed.k.version(PIPELINE, v2), actor="setup", reason="v2 serves, v1 standby")
    bed.states_before = {r.version: str(r.state) for r in bed.k.registry.list_versions(PIPELINE)}


def flips(bed: Bed) -> list:
    return [e for e in bed.k.registry.audit_log(PIPELINE, limit=None, action="flip_alias") if e.outcome == "ok"]


def oracle(bed: Bed, served: int) -> tuple[bool, bool, list[str]]:
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


def one_line_error(result, *must: str) -> str:
    """The one line a failed command printed (no traceback, `Error: ...`), which names each of `must`."""
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in result.output, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), f"not one error line: {result.stderr!r}"
    line = lines[0]
    missing = [m for m in must if m not in line]
    assert not missing, f"the error does not say {missing}: {line}"
    return line


@dataclass
class Healed:
    did: str            # what kappa did, for the table
    seconds: float      # from the fault to the oracle's pass
    exact: bool
    consistent: bool
    problems: list[str]


def verb_under_fault(bed: Bed, verb: str, point: str, inject: Callable[[], None], heal: Callable[[], None],
                     *must: str) -> Healed:
    """Promote v2 over v1 (`verb` "promote") or roll v2 back to v1 ("rollback") through the CLI, with
    `inject()` run once at the point `point`. A verb that fails must fail in one line naming `must`; then
    `heal()` and the same command again must complete. Then `kappa reconcile`, and the oracle."""
    serving_v1_then_v2_ready(bed, v2_serves=verb == "rollback")
    served = 2 if verb == "promote" else 1
    args = ["promote", PIPELINE, "2"] if verb == "promote" else ["rollback", PIPELINE]
    before = len(flips(bed))
    injected: list[float] = []

    def once():
        if not injected:
            injected.append(time.monotonic())
            inject()

    crashpoints.hook(point, once)
    try:
        first = bed.run(*args, "--actor", "fault-test", "--reason", f"fault at {point}")
    finally:
        crashpoints.disarm()
    assert injected, f"the {verb} never reached {point}"
    if first.exit_code == 0:
        did = "completed"
        heal()
    else:
        line = one_line_error(first, *must)
        print(f"\n{verb}, fault at {point}: {line}")
        heal()
        again = bed.run(*args, "--actor", "fault-test", "--reason", f"retry after the fault at {point}")
        assert again.exit_code == 0, f"the retry did not complete: {again.output}"
        short = re.sub(r"\S+://\S+ ", "", line.removeprefix("Error: "))   # the URL named is long and says little here
        did = f"failed in one line ({short[:90]}...), completed on retry"
    rec = bed.run("reconcile", "--actor", "fault-test")
    assert rec.exit_code == 0, rec.output
    exact, consistent, problems = oracle(bed, served)
    moved = flips(bed)[before:]
    if [(e.details or {}).get("to_version") for e in moved] != [served]:
        consistent = False
        problems.append(f"the alias moved {len(moved)} times: {[(e.details or {}) for e in moved]}")
    return Healed(did, time.monotonic() - injected[0], exact, consistent, problems)
