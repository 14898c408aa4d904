"""The terminal's small commands: `kappa --version`, shell completion, `kappa logs [-f]`, `kappa resolve`.

`logs -f` follows a real process recorded as a version's job (launch.json with its PID and creation
time), which writes the log itself; the follow loop's pause is the one place the test steps in, to let
the job write its last words and end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version as dist_version

import psutil
import pytest
from typer.testing import CliRunner

from orchestrator.cli import terminal
from orchestrator.core.files import write_json_atomic
from orchestrator.serving import describe_alias, publish_current, write_pointer

PIPELINE, ALIAS = "standardize", "member_profiles_std"
SECRET = "hunter2-s3cret"
KAFKA_CONFIG = json.dumps({"sasl.password": SECRET})


def test_version_names_kappa_and_what_it_runs_on(run):
    result = run("--version", home_flag=False)
    assert result.exit_code == 0, result.output
    line = result.stdout.strip()
    assert line.startswith(f"kappa {dist_version('kappa')} (Python ")
    assert f"pyspark {dist_version('pyspark')}" in line and f"deltalake {dist_version('deltalake')}" in line


def test_completion_is_offered_by_the_root_app_only(run, monkeypatch):
    import typer.completion

    from orchestrator.cli import app

    # --show-completion is a flag whose shell typer detects from the process's ancestors; a test run
    # with no shell among them (a CI runner, a process whose parent shell exited) found none and
    # printed "Shell  not supported.": the detection answers bash here, whoever started the tests
    monkeypatch.setattr(typer.completion, "_get_shell_name", lambda: "bash")
    script = CliRunner().invoke(app, ["--show-completion"], prog_name="kappa")
    assert script.exit_code == 0, script.output
    assert "_kappa_completion()" in script.stdout and "complete -o default -F _kappa_completion kappa" in script.stdout
    root = run("--help").stdout
    assert "--install-completion" in root and "--show-completion" in root
    assert "--install-completion" not in run("broker", "--help").stdout


def test_completion_completes_command_names():
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli"], capture_output=True, text=True, timeout=60,
                          env={"_KAPPA_COMPLETE": "complete_bash", "COMP_WORDS": "kappa reso", "COMP_CWORD": "1",
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["resolve"]


# -- logs --------------------------------------------------------------------------------------------

def _log(seeded, version: int = 1):
    path = seeded.paths(PIPELINE, version).log_file
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_logs_prints_the_last_lines_with_secrets_masked(run, seeded):
    _log(seeded).write_text("".join(f"line {i}\n" for i in range(1, 50)) + f"auth failed for password {SECRET}\n"
                            + "partial")
    result = run("--kafka-config", KAFKA_CONFIG, "logs", PIPELINE, "1", "-n", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["line 49", "auth failed for password ***", "partial"]
    assert SECRET not in result.output
    default = run("logs", PIPELINE, "1").stdout.splitlines()
    assert len(default) == 40 and default[0] == "line 12"


def test_logs_of_an_unknown_version_or_a_job_never_started_is_one_line(run, seeded):
    unknown = run("logs", PIPELINE, "7")
    assert unknown.exit_code == 1 and unknown.stdout == ""
    assert unknown.stderr.startswith("Error: ") and "no version v7" in unknown.stderr
    assert len(unknown.stderr.splitlines()) == 1
    assert run("logs", "nosuch", "1").stderr.startswith("Error: unknown pipeline 'nosuch'")
    never = run("logs", PIPELINE, "2", "-f")
    assert never.exit_code == 1
    assert never.stderr.startswith(f"Error: {PIPELINE} v2 has no job log at ")


def test_logs_follow_of_a_dead_job_prints_all_and_ends(run, seeded):
    _log(seeded).write_text("a\nb\nlast words")
    result = run("logs", PIPELINE, "1", "-f", "-n", "5")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["a", "b", "last words"]


def test_logs_follow_prints_what_a_live_job_writes_until_it_ends(run, seeded, monkeypatch):
    log = _log(seeded)
    log.write_text("before\n")
    script = ("import sys; print('started', flush=True); sys.stdin.read(); "
              f"print('secret {SECRET}', flush=True); print('bye', end='', flush=True)")
    with open(log, "ab") as out:
        job = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=out)
    try:
        write_json_atomic(seeded.paths(PIPELINE, 1).launch_file,
                          {"pid": job.pid, "created": psutil.Process(job.pid).create_time(), "mode": "local"})
        pauses = []

        def pause(seconds: float) -> None:   # the job lives on until the follow has paused once
            pauses.append(seconds)
            if job.poll() is None:
                job.stdin.close()
                job.wait(30)

        monkeypatch.setattr(terminal, "_sleep", pause)
        result = run("--kafka-config", KAFKA_CONFIG, "logs", PIPELINE, "1", "--follow")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["before", "started", "secret ***", "bye"]
    assert pauses and job.returncode == 0


def test_follow_log_reads_what_is_appended_and_a_replaced_log_from_its_start(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("one\n")
    writes = iter([lambda: log.write_text("one\ntw"), lambda: log.open("a").write("o\n"),
                   lambda: log.write_text("new\n")])
    alive = iter([True] * 5 + [False])
    got: list[str] = []
    terminal.follow_log(log, 4, lambda: next(alive), got.append, sleep=lambda s: next(writes)())
    assert got == ["two", "new"]


# -- resolve -----------------------------------------------------------------------------------------

@pytest.fixture
def served(seeded):
    from tests.unit.control.control_helpers import profiles, write_table

    write_table(seeded.paths(PIPELINE, 1).table, profiles([("m1", "swe", "SWE", "Ada", 1)]))
    seeded.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=1, actor="alice",
                               reason="first rules")
    pointer = publish_current(seeded, ALIAS)
    return seeded, pointer


def test_resolve_json_names_table_versions_and_publication(run, served):
    k, pointer = served
    result = run("resolve", ALIAS, "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert {key: d[key] for key in ("alias", "pipeline", "version", "table", "published_at", "delta_version",
                                    "rules_version", "previous_version", "flipped_by", "reason",
                                    "pending_version")} == {
        "alias": ALIAS, "pipeline": PIPELINE, "version": 1, "table": str(k.paths(PIPELINE, 1).table),
        "published_at": pointer["published_at"], "delta_version": 0, "rules_version": "v1",
        "previous_version": None, "flipped_by": "alice", "reason": "first rules", "pending_version": None}
    assert d["pointer_file"] == str(k.alias_file(ALIAS)) and d["delta_committed_at"] > 0
    text = run("resolve", ALIAS).stdout
    assert f"serves    {PIPELINE} v1 (rules v1)" in text and f"table     {k.paths(PIPELINE, 1).table}" in text
    assert "delta     version 0, last commit " in text and "flipped   " in text and "by alice from nothing" in text


def test_resolve_shows_a_flip_not_yet_published(run, served):
    from tests.unit.control.control_helpers import profiles, write_table

    k, _ = served
    write_table(k.paths(PIPELINE, 2).table, profiles([("m1", "swe", "Software Engineer", "Ada", 1)]))
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=1, new_version=2, actor="bob", reason="v2")
    d = json.loads(run("resolve", ALIAS, "--json").stdout)
    assert (d["version"], d["pending_version"]) == (1, 2)   # readers still see v1
    assert "the registry serves v2, not yet published; `kappa reconcile` publishes it" in run("resolve", ALIAS).stdout


def test_resolve_from_the_pointer_alone_creates_no_registry(run, home, tmp_path):
    from orchestrator.context import Kappa
    from orchestrator.core.settings import resolve_settings
    from tests.unit.control.control_helpers import profiles, write_table

    table = tmp_path / "elsewhere" / "v3"
    write_table(table, profiles([("m1", "swe", "SWE", "Ada", 1)]))
    k = Kappa(resolve_settings(home=str(home), env={}))
    write_pointer(k.alias_file(ALIAS), {"alias": ALIAS, "pipeline": PIPELINE, "version": 3, "table": str(table),
                                        "published_at": 1700000000.0})
    info = describe_alias(k, ALIAS)
    assert (info.version, info.table, info.published_at, info.flipped_at) == (3, str(table), 1700000000.0, None)
    assert run("resolve", ALIAS).exit_code == 0
    assert not (home / "registry.db").exists()


def test_resolve_of_an_unknown_alias_is_one_line(run, seeded):
    result = run("resolve", "nosuch_alias")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("Error: alias 'nosuch_alias' is not published: no pointer file at ")
    assert len(result.stderr.splitlines()) == 1
