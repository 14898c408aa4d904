"""Exit codes scripts can use (0 ok, 1 error, 2 usage, 3 refused) and `kappa retire`'s confirmation.

Fakes stand in for a verb only to make it refuse or fail in a chosen way; the retire tests run the real
verb on a seeded registry, with the broker's consumer-group deletion faked.
"""

from __future__ import annotations

from pathlib import Path
import pytest

from orchestrator.cli.app import EXIT_ERROR, EXIT_REFUSED, exit_code_of
from orchestrator.core.exceptions import (ConfigError, ConflictError, KappaError, LifecycleError, NotFoundError,
                                          NotReadyError, RefusedError, SourceError, SourceRefusedError)

PIPELINE = "standardize"


@pytest.mark.parametrize("error, code", [
    (NotReadyError("standardize v2 is not ready: total lag 1200"), 3),
    (ConflictError("pipeline 'standardize' already has v1 in flight"), 3),
    (RefusedError("cannot retire standardize v1: it serves alias 'x'"), 3),
    (SourceRefusedError("source topic 't' has cleanup.policy=delete"), 3),
    (LifecycleError("spark-submit not found"), 1),
    (SourceError("broker unavailable"), 1),
    (NotFoundError("unknown pipeline 'x'"), 1),
    (ConfigError("invalid setting"), 1),
])
def test_a_refusal_exits_3_and_an_error_1_each_on_one_line(run, monkeypatch, error, code):
    def verb(*args, **kwargs):
        raise error

    monkeypatch.setattr("orchestrator.lifecycle.deploy.deploy", verb)
    result = run("deploy", PIPELINE)
    assert result.exit_code == code == exit_code_of(error)
    assert result.stderr == f"Error: {error}\n" and result.stdout == ""


def test_refusals_keep_their_area_class():
    """`except LifecycleError` / `except SourceError` still catch the refusals raised as those."""
    assert issubclass(RefusedError, LifecycleError) and issubclass(SourceRefusedError, SourceError)
    assert exit_code_of(KappaError("x")) == EXIT_ERROR and exit_code_of(RefusedError("x")) == EXIT_REFUSED


def test_root_help_documents_the_exit_codes(run):
    text = " ".join(run("--help").stdout.split())
    assert "Exit codes: 0 done; 1 error" in text and "2 usage error; 3 refused" in text


# -- retire's confirmation ---------------------------------------------------------------------------

@pytest.fixture
def groups(monkeypatch):
    deleted: list[str] = []
    monkeypatch.setattr("orchestrator.lifecycle.retire._delete_group", lambda k, g: deleted.append(g) or "deleted")
    return deleted


def _state(k, v: int) -> str:
    return k.registry.get_version(PIPELINE, v).state


def test_retire_off_a_terminal_without_yes_refuses_and_deletes_nothing(run, seeded, groups):
    table = Path(seeded.paths(PIPELINE, 1).table)
    table.mkdir(parents=True)
    result = run("retire", PIPELINE, "1")
    assert result.exit_code == 3 and result.stdout == ""
    assert result.stderr == (f"Error: not retiring {PIPELINE} v1: it deletes the version's table, checkpoint and "
                             f"consumer group, and stdin is not a terminal to confirm it on; pass --yes (see what it "
                             f"would delete with --dry-run)\n")
    assert _state(seeded, 1) == "stopped" and table.exists() and groups == []
    assert run("retire", PIPELINE, "1", "--dry-run").exit_code == 0   # a dry run deletes nothing: no question

    done = run("retire", PIPELINE, "1", "--yes")
    assert done.exit_code == 0, done.output
    assert _state(seeded, 1) == "retired" and not table.exists() and groups == [f"kappa.{PIPELINE}.v1"]


def test_retire_on_a_terminal_shows_the_plan_and_asks(run, seeded, groups, monkeypatch):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    monkeypatch.setattr("orchestrator.cli.lifecycle._on_a_terminal", lambda: True)
    argv = ["--home", str(seeded.settings.home), "retire", PIPELINE, "2"]
    declined = CliRunner().invoke(app, argv, input="n\n")
    assert declined.exit_code == 3, declined.output
    assert f"dry run: would retire {PIPELINE} v2" in declined.stderr
    assert f"Retire {PIPELINE} v2? This cannot be undone [y/N]" in declined.stderr
    assert declined.stderr.endswith(f"Error: not retiring {PIPELINE} v2: not confirmed; nothing was deleted\n")
    assert _state(seeded, 2) == "stopped" and groups == []

    confirmed = CliRunner().invoke(app, argv, input="y\n")
    assert confirmed.exit_code == 0, confirmed.output
    assert f"retired {PIPELINE} v2" in confirmed.stdout
    assert _state(seeded, 2) == "retired" and groups == [f"kappa.{PIPELINE}.v2"]
