"""Each version keeps the rules it was deployed with, read from the team's rules location.

The case issue 20 found on the code before: v1 deployed with titles/v1.toml, the file edited
("Software Engineer" renamed), v1's job killed and restarted by the supervisor with the edited
file: one version, two rule sets. Here every start of a version gets the text stored at its deploy.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from control_helpers import FAKE_JOB, PIPELINE, make_spec
from jobs.lib.rules.files import RULES_DIR, load_rules
from orchestrator.core.exceptions import ConfigError, LifecycleError, NotFoundError, RulesError
from orchestrator.context import Kappa, VersionRef
from orchestrator.core.settings import resolve_settings
from orchestrator.jobctl import launch, start_version, stop_version
from orchestrator.lifecycle import deploy as deploy_mod
from orchestrator.lifecycle.deploy import check_request, deploy
from orchestrator.jobctl.version_rules import deployed_rules, file_state, rules_diff

EDIT = ('"Software Engineer" = [', '"Software Eng." = [')


@pytest.fixture
def team(tmp_path):
    """A team's rules folder outside kappa's package: titles v1 and v2 as kappa ships them."""
    root = tmp_path / "team-repo" / "rules"
    shutil.copytree(RULES_DIR / "titles", root / "titles")
    return root


@pytest.fixture
def kt(k, team):
    """A Kappa whose rules location is the team's folder, with a pipeline on the titles ruleset."""
    settings = k.settings.model_copy(update={"rules_location": str(team)})
    return Kappa(settings, registry=k.registry, pipelines={PIPELINE: make_spec(ruleset="titles")})


@pytest.fixture
def policies(monkeypatch):
    monkeypatch.setattr(deploy_mod, "_topic_policies", lambda k, topics: {t: ("compact", False) for t in topics})


@pytest.fixture
def started(monkeypatch):
    """Fake jobs through start_version; records the rules file each start handed its job, and its text."""
    starts: list[tuple[int, str, str]] = []

    def job_command(v, *, trigger="continuous", rules_file=None, master=None):
        starts.append((v.version, str(rules_file), open(rules_file, encoding="utf-8").read()))
        run_dir = v.paths.run_dir
        return [sys.executable, str(FAKE_JOB), "--run-dir", str(run_dir), "--behaviour", "normal"], "local"

    monkeypatch.setattr(launch, "job_command", job_command)
    return starts


def _edit(path):
    text = path.read_text(encoding="utf-8")
    assert EDIT[0] in text
    path.write_text(text.replace(EDIT[0], EDIT[1]), encoding="utf-8")


def test_a_restart_after_the_rules_file_was_edited_runs_the_rules_of_the_deploy(kt, team, policies, started):
    original = (team / "titles" / "v1.toml").read_text(encoding="utf-8")
    info = deploy(kt, kt.pipeline(PIPELINE), "v1", actor="alice", reason="first")
    rec = kt.registry.get_version(PIPELINE, info.version)
    assert rec.details["rules"] == {"ruleset": "titles", "version": "v1", "file": str(team / "titles" / "v1.toml"),
                                    "hash": rec.rules_hash, "text": original}
    stored_file = kt.paths(PIPELINE, info.version).run_dir / "rules" / "titles" / "v1.toml"
    assert started == [(info.version, str(stored_file), original)]
    assert file_state(VersionRef.of_record(kt, kt.pipeline(PIPELINE), rec)) == "same"

    _edit(team / "titles" / "v1.toml")                       # the team edits v1 after the deploy
    assert load_rules(team / "titles" / "v1.toml").content_hash != rec.rules_hash
    stop_version(kt.version(PIPELINE, info.version), actor="test", reason="the job died", force=True, final_state=None)
    start_version(kt.version(PIPELINE, info.version), actor="supervisor", reason="restart after a crash")
    assert started[-1] == (info.version, str(stored_file), original)
    assert load_rules(stored_file).content_hash == rec.rules_hash
    assert file_state(VersionRef.of_record(kt, kt.pipeline(PIPELINE), rec)) == "changed"
    for entry in kt.registry.audit_log(PIPELINE):          # the text lives in the version, not in the audit log
        assert "Software Engineer" not in json.dumps(entry.details), entry.action


def test_rules_come_from_the_rules_location_and_the_newest_is_the_default(kt, team, policies):
    shutil.copy(team / "titles" / "v2.toml", team / "titles" / "v10.toml")
    plan = check_request(kt, kt.pipeline(PIPELINE))
    assert (plan.rules_version, plan.rules_file) == ("v10", str(team / "titles" / "v10.toml"))
    shutil.copytree(team / "titles", team / "skills")     # a ruleset kappa does not ship
    kt2 = Kappa(kt.settings, registry=kt.registry, pipelines={PIPELINE: make_spec(ruleset="skills")})
    assert check_request(kt2, kt2.pipeline(PIPELINE), "v1").rules_file == str(team / "skills" / "v1.toml")
    with pytest.raises(RulesError) as e:
        check_request(kt, kt.pipeline(PIPELINE), "v3")
    assert str(e.value) == (f"no rules file {team / 'titles' / 'v3.toml'}: ruleset 'titles' has versions v1, v2, v10; "
                            f"add v3.toml to {team / 'titles'} or pick one of those")


def test_a_version_deployed_before_rules_were_stored_starts_only_while_its_file_is_unchanged(kt, team, started):
    rules = load_rules(team / "titles" / "v1.toml")
    rec = kt.registry.allocate_version(PIPELINE, rules_version="v1", rules_hash=rules.content_hash, code_ref="old",
                                       paths=lambda n: kt.paths(PIPELINE, n), actor="old kappa", reason="before",
                                       details={"threshold": 0})
    assert deployed_rules(VersionRef.of_record(kt, kt.pipeline(PIPELINE), rec)).stored is False
    start_version(kt.version(PIPELINE, rec.version), actor="test", reason="unchanged file")
    assert started[-1][2] == (team / "titles" / "v1.toml").read_text(encoding="utf-8")
    stop_version(kt.version(PIPELINE, rec.version), actor="test", reason="r", force=True, final_state=None)

    _edit(team / "titles" / "v1.toml")
    with pytest.raises(LifecycleError) as e:
        start_version(kt.version(PIPELINE, rec.version), actor="test", reason="edited file")
    assert str(e.value).startswith(f"{PIPELINE} v{rec.version} was deployed before kappa stored each version's "
                                   f"rules, and {team / 'titles' / 'v1.toml'} has changed since (hash ")
    assert str(e.value).endswith("starting it would run other rules under its name. Restore the file as deployed "
                                 "or deploy a new version with the edited rules")
    assert len(started) == 1


def test_rules_diff_compares_what_two_versions_run(kt, team, policies, started):
    v1 = deploy(kt, kt.pipeline(PIPELINE), "v1", actor="alice", reason="r", start=False).version
    v2 = deploy(kt, kt.pipeline(PIPELINE), "v2", actor="alice", reason="r", start=False, queue=True).version
    _edit(team / "titles" / "v1.toml")                      # what v1 runs does not change
    d = rules_diff(kt.version(PIPELINE, v1), kt.version(PIPELINE, v2))
    assert not d.same_content and (d.old_rules, d.new_rules) == ("v1", "v2")
    assert d.diff[0].startswith(f"--- {PIPELINE} v{v1} (rules v1, ") and d.diff[1].startswith(f"+++ {PIPELINE} v{v2}")
    removed = [line for line in d.diff if line.startswith("-") and not line.startswith("---")]
    assert removed and not any("Software Eng." in line for line in d.diff)
    assert rules_diff(kt.version(PIPELINE, v1), kt.version(PIPELINE, v1)).diff == []
    with pytest.raises(NotFoundError):
        rules_diff(kt.version(PIPELINE, v1), kt.version(PIPELINE, 99))


def test_the_rules_location_setting_takes_a_folder_or_a_file_uri(tmp_path, team):
    s = resolve_settings(home=str(tmp_path / "h"), env={"KAPPA_RULES": f"file://{team}"})
    assert s.rules_location == f"file://{team}"
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "kappa.toml").write_text('rules_location = "../team-repo/rules"\n')
    s = resolve_settings(home=str(tmp_path / "h"), env={})
    assert s.rules_location == str(team)
    with pytest.raises(ConfigError) as e:
        resolve_settings(home=str(tmp_path / "h"), env={"KAPPA_RULES": "s3://bucket/rules"})
    assert "\n" not in str(e.value)
    assert str(e.value).startswith("invalid setting rules_location")
    assert "rules are read from a local folder or a file:// URI" in str(e.value)
    assert "KAPPA_RULES" in str(e.value)


def test_file_state_names_a_rules_file_gone_or_broken_since_the_deploy(kt, team, policies):
    rec = deploy(kt, kt.pipeline(PIPELINE), "v1", actor="alice", reason="r", start=False)
    rec = kt.registry.get_version(PIPELINE, rec.version)
    path = team / "titles" / "v1.toml"
    path.write_text("format_version = 1\n[titles.aliases]\n\"A\" = [\"x\"]\n\"B\" = [\"X\"]\n", encoding="utf-8")
    assert file_state(VersionRef.of_record(kt, kt.pipeline(PIPELINE), rec)) == "invalid"
    path.unlink()
    assert file_state(VersionRef.of_record(kt, kt.pipeline(PIPELINE), rec)) == "missing"
    assert deployed_rules(VersionRef.of_record(kt, kt.pipeline(PIPELINE), rec)).stored               # what v1 runs is still there
