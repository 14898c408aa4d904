"""A team's project, as a new user builds one: kappa installed from its wheel (not editable) into a
fresh virtualenv, `kappa init` in a folder outside the repository (the project's own test of its
job passes there, in a pytest of its own with kappa's helpers), a second rules version added
there, and then, against the embedded broker, from that folder: deploy v1, promote, deploy v2 with
the new rules, promote, edit the v1 rules file, roll back to v1 (restarted from its checkpoint) and
get exactly the table the ORIGINAL v1 rules give, over records produced after the edit too.

Expected tables come from the test's own mapping of the few raw titles it produces (what the
shipped titles v1 and the test's v2 say about them), not from kappa's rules engine.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from orchestrator.dev import datagen
from tests.wheel import build_wheel
from tests.shell import users_env

pytestmark = pytest.mark.integration

TIMEOUT = 900
RAW_TITLES = ["swe", "software eng", "Data Scientist", "ds", "pm", "product mgr"]
V1 = {"swe": "Software Engineer", "software eng": "Software Engineer", "Data Scientist": "Data Scientist",
      "ds": "Data Scientist", "pm": "Product Manager", "product mgr": "Product Manager"}
V2 = {**V1, "pm": "Product Owner", "product mgr": "Product Owner"}
PM_LINE = '"Product Manager" = ["pm", "product mgr"]'
SWE_LINE = '"Software Engineer" = ["swe", "software engineering", "software eng"]'


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh virtualenv with kappa's wheel installed (no editable install); its dependencies come
    from the test environment's site-packages through a .pth file, so nothing is downloaded."""
    wheel = build_wheel(tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel"))
    venv = tmp_path_factory.mktemp("venv") / "v"
    run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    site = Path(run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)])
    # from a folder outside the checkout: `python -c` puts the working folder first on sys.path
    where = run([str(py), "-c", "import orchestrator, jobs; print(orchestrator.__file__, jobs.__file__)"],
                cwd=venv).stdout
    assert all(p.startswith(str(venv)) for p in where.split()), where   # kappa from the wheel, not the checkout
    return venv


def run(argv: list[str], cwd: Path | None = None, env: dict | None = None, ok: bool = True):
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    if ok:
        assert proc.returncode == 0, f"{argv}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def produce(bootstrap: str, n: int, seed: int) -> None:
    rng = random.Random(seed)
    datagen.produce(bootstrap, "member_profiles", [
        datagen.ChangeRecord(key=f"m{rng.randrange(40):03d}".encode(), kind="upsert",
                             value=json.dumps({"name": f"n{rng.randrange(99)}", "title": rng.choice(RAW_TITLES)}).encode())
        for _ in range(n)])


def expected(bootstrap: str, mapping: dict[str, str]) -> dict[str, str]:
    latest = {}
    for r in sorted(datagen.iter_log(bootstrap, "member_profiles"), key=lambda r: (r.partition, r.offset)):
        latest[r.key.decode()] = json.loads(r.value)["title"]
    return {k: mapping[t] for k, t in latest.items()}


def served(project: Path) -> dict[str, str]:
    from orchestrator.core.settings import resolve_settings
    from orchestrator.core.tables import read_table
    from orchestrator.serving import open_alias

    settings = resolve_settings(None, env={}, cwd=project)
    return {r["member_id"]: r["title"] for r in read_table(open_alias("team_profiles", settings)).to_pylist()}


def test_kappa_init_then_deploy_promote_new_rules_and_roll_back_to_the_rules_v1_was_deployed_with(venv, tmp_path):
    kappa = str(venv / "bin" / "kappa")
    # a team's shell: none of this suite's own settings (KAPPA_* but the jobs' JIT, its pytest's PYTEST_ADDOPTS and
    # worker variables)
    env = users_env("PYTHONPATH", "PYTEST_")
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    project = tmp_path / "team-project"
    run([kappa, "init", str(project)], env=env)
    # the project's own test of its job passes, in a local Spark session with kappa's helpers (jobs.lib.contract.testing)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    own = run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=project,
              env={**env, "TMPDIR": str(scratch)})
    assert "1 passed" in own.stdout, own.stdout[-3000:]
    assert not list(scratch.glob("kappa-job-tests-*")), "the local Spark session's scratch folder outlived its process"
    v1_rules = project / "rules" / "titles" / "v1.toml"
    text = v1_rules.read_text(encoding="utf-8")
    assert PM_LINE in text and SWE_LINE in text
    (project / "rules" / "titles" / "v2.toml").write_text(
        text.replace(PM_LINE, '"Product Owner" = ["pm", "product mgr"]'), encoding="utf-8")

    def k(*args: str, ok: bool = True):
        return run([kappa, *args], cwd=project, env=env, ok=ok)

    broker = json.loads(k("broker", "start", "--json").stdout)
    bootstrap = broker["bootstrap_servers"]
    try:
        datagen.ensure_topic(bootstrap, "member_profiles", 2)
        produce(bootstrap, 300, seed=1)
        deployed = k("deploy", "profiles", "--rules", "v1", "--wait").stdout
        assert "deployed profiles v1 (rules v1)" in deployed
        assert "profiles v1 is ready: promote it with `kappa promote profiles 1`" in deployed
        dry = k("promote", "profiles", "--dry-run").stdout
        assert "dry run: would promote profiles v1 (alias 'team_profiles' from nothing)" in dry
        promoted = k("promote", "profiles", "1").stdout
        assert "promoted profiles v1: alias 'team_profiles' moved from nothing to v1" in promoted
        assert served(project) == expected(bootstrap, V1)
        k("deploy", "profiles", "--rules", "v2", "--wait")
        k("promote", "profiles", "2")
        assert served(project) == expected(bootstrap, V2)

        refused = k("stop", "profiles", "2", ok=False)              # v2 serves: a refusal (3), not an error
        assert refused.returncode == 3 and refused.stderr.startswith("Error: profiles v2 is serving alias 'team_profiles'")
        # v1's job stops; its rules file is edited; new records arrive; the rollback restarts v1
        k("stop", "profiles", "1")
        v1_rules.write_text(text.replace(SWE_LINE, '"Engineer of Software" = ["swe", "software eng"]'),
                            encoding="utf-8")
        produce(bootstrap, 60, seed=2)
        k("rollback", "profiles", "--to", "1")
        status = json.loads(k("status", "profiles", "--json").stdout)
        assert "changed" in json.dumps(status), status          # kappa says the file differs from v1's rules
        from tests.waiting import wait_until

        want = expected(bootstrap, V1)
        wait_until(lambda: served(project) == want, "v1 to serve the original v1 rules' table over the whole log",
                   300, poll=2)
        assert "Engineer of Software" not in set(served(project).values())
        entries = json.loads(k("history", "--json").stdout)["entries"]
        done = [e["action"] for e in entries if e["outcome"] == "ok" and e["action"] in ("deploy", "promote", "stop",
                                                                                          "rollback")]
        assert done == ["deploy", "promote", "deploy", "promote", "stop", "rollback"], entries
    finally:
        for v in ("1", "2"):
            k("stop", "profiles", v, "--force", ok=False)
        k("broker", "stop", ok=False)
