"""`kappa supervise`: monitor passes in the foreground, one line per action, a pass's error printed
and survived (the embedded default's supervisor without Airflow)."""

from __future__ import annotations

import threading

from typer.testing import CliRunner

from control_helpers import ALIAS, PIPELINE
from orchestrator.cli import supervise as cli_sup
from orchestrator.core.exceptions import RegistryError
from orchestrator.lifecycle import monitor as monitor_mod

PIPELINES = f"""
[pipelines.{PIPELINE}]
job = "standardize"
topics = ["orders"]
key = "member_id"
alias = "{ALIAS}"
max_restarts = 3
restart_window_seconds = 300
"""


def test_a_failing_pass_is_printed_and_the_next_pass_runs(monkeypatch):
    calls = []

    def fake_monitor(k, *, actor, pipelines=None, raise_on_problem=True):
        calls.append((actor, raise_on_problem))
        if len(calls) == 1:
            raise RegistryError("the registry database is locked\n(retry)")
        return monitor_mod.MonitorReport(at=0.0, reconciled=[
            {"kind": "restart", "pipeline": PIPELINE, "version": 2, "pid": 42, "attempt": 1}],
            problems=[f"{PIPELINE} v1 serves alias {ALIAS!r} but is failing: x"])

    monkeypatch.setattr(monitor_mod, "monitor", fake_monitor)
    out, err = [], []
    failed = cli_sup.run_passes(lambda: None, actor="sup", interval=0, passes=3, out=out.append, err=err.append,
                                stop=threading.Event())
    assert failed == 1 and len(calls) == 3 and {c for c in calls} == {("sup", False)}
    assert "error pass 1 failed (RegistryError): the registry database is locked (retry)" in err[0]
    assert len(out) == 2 and all(f"restart {PIPELINE} v2 " in line and '"pid": 42' in line for line in out)
    assert sum("problem" in line for line in err) == 2


def test_the_command_runs_passes_until_told_to_stop(tmp_path):
    from orchestrator.cli import app

    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(PIPELINES)
    argv = ["--home", str(tmp_path / "home"), "--pipelines-file", str(pipelines), "--bootstrap-servers",
            "127.0.0.1:9", "supervise", "--interval", "0.1", "--passes", "2", "--actor", "ops"]
    result = CliRunner().invoke(app, argv, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "supervising every pipeline every 0.1 s as ops" in result.output
    assert "supervisor stopped after" in result.output and "passes failed" not in result.output
