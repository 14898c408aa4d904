"""`kappa init DIR`: the files of a new project, the settings they give kappa from that folder, and a
folder that has the files refused. The project's own test, run from
the installed wheel: tests/integration/cli/test_cli_team_project.py."""

from __future__ import annotations

from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.core.settings import resolve_settings
from orchestrator.dev.project import PROJECT_FILES


def test_init_writes_a_project_whose_settings_kappa_finds_there(tmp_path):
    root = tmp_path / "team-project"
    res = CliRunner().invoke(app, ["init", str(root)])
    assert res.exit_code == 0, res.output
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == sorted(PROJECT_FILES)
    assert f"wrote {root / 'team_jobs' / 'profiles.py'}" in res.output
    s = resolve_settings(None, env={}, cwd=root)
    assert (s.pipelines_file, s.rules_location, s.job_folders) == (
        root / "pipelines.toml", str(root / "rules"), [str(root)])
    from orchestrator.core.pipelines import load_pipelines
    from orchestrator.jobctl.jobcheck import check_job_exists

    spec = load_pipelines(s.pipelines_file)["profiles"]
    assert check_job_exists(spec, job_path=s.job_folders) == "team_jobs.profiles:transform"

    again = CliRunner().invoke(app, ["init", str(root)])
    assert again.exit_code != 0
    assert f"{root} already has .kappa/kappa.toml, pipelines.toml" in again.output
    assert "overwrites nothing" in again.output
