"""`kappa --help` lists every KAPPA_* variable kappa reads, from the one catalogue."""

from __future__ import annotations

from orchestrator.core.envvars import CATALOGUE


def test_help_lists_every_catalogued_variable(run):
    result = run("--help", home_flag=False)
    assert result.exit_code == 0, result.output
    section = result.stdout.split("Environment variables (flag > variable > config file > default):", 1)
    assert len(section) == 2, result.stdout
    listed = [line.split()[0] for line in section[1].splitlines() if line.startswith("  KAPPA_")]
    assert listed == list(CATALOGUE)


def test_only_the_root_help_has_the_table(run):
    result = run("airflow", "--help", home_flag=False)
    assert result.exit_code == 0, result.output
    assert "Environment variables" not in result.stdout
