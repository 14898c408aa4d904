"""`kappa rules preview` and `kappa rules check`: what they print, their one-line errors and exit codes."""

from __future__ import annotations

import json
import shutil

import pytest
from rules_helpers import ALIAS, PIPELINE, serve, standardized

import jobs.lib.rules.files as rules_mod
from jobs.lib.rules.files import RULES_DIR, load_rules
from orchestrator.cli.app import error_line
from orchestrator.core.exceptions import RulesError

ROWS = [("m1", "Sr. Software Engineer", "acme"), ("m2", "Developer", "Hooli"), ("m3", "developer", None),
        ("m4", "swe", "Globex"), ("m5", "pm", "Wayne Ent.")]


def one_error_line(res) -> str:
    assert res.exit_code == 1 and res.stdout == "", res.stdout
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr
    return lines[0]


def test_preview_prints_the_changes(k, run):
    serve(k, standardized(ROWS, "v1"))
    res = run("rules", "preview", PIPELINE, "--rules", "v2")
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"rules preview: {PIPELINE} rules v2 against served v1 (rules v1), alias {ALIAS}"
    assert lines[1].startswith(f"  table {k.paths(PIPELINE, 1).table} (Delta version 0): 5 rows read and compared in ")
    assert lines[2] == "  rows the new rules would change: 4 (title: 3, company: 1)"
    rows = [line for line in lines if line.startswith("│")]
    assert [[c.strip() for c in r.strip("│").split("│")] for r in rows] == [
        ["2", "Software Developer", "Software Engineer"],
        ["1", "Software Engineer", "Senior Software Engineer"],
        ["1", "Wayne Ent.", "Wayne Enterprises"]]


def test_preview_json_is_the_verbs_result(k, run):
    from orchestrator.lifecycle.preview import preview_rules

    serve(k, standardized(ROWS, "v1"))
    res = run("rules", "preview", PIPELINE, "--rules", "v1", "--json", "--top", "1")
    assert res.exit_code == 0, res.stderr
    got = json.loads(res.stdout)
    want = preview_rules(k, k.pipeline(PIPELINE), "v1", top=1).model_dump(mode="json")
    for volatile in ("generated_at", "seconds"):
        got.pop(volatile), want.pop(volatile)
    assert got == want and got["rows_changed"] == 0 and got["serving_rules_hash"] == got["rules_hash"]


@pytest.mark.parametrize("args, start", [
    (("nope", "--rules", "v2"), "Error: unknown pipeline 'nope': the pipelines declared in "),
    ((PIPELINE, "--rules", "v2"), f"Error: pipeline '{PIPELINE}' serves nothing yet (alias '{ALIAS}' is not "
                                  f"published)"),
    (("pageviews_hourly", "--rules", "v2"), "Error: pipeline 'pageviews_hourly' (job 'pageviews_hourly') takes "
                                            "no rules"),
])
def test_preview_refusals_are_one_line(run, args, start):
    assert one_error_line(run("rules", "preview", *args)).startswith(start)


def test_preview_of_a_missing_rules_version_names_the_known_ones(k, run):
    serve(k, standardized(ROWS, "v1"))
    line = one_error_line(run("rules", "preview", PIPELINE, "--rules", "v9"))
    assert line == (f"Error: no rules file {RULES_DIR / 'titles' / 'v9.toml'}: ruleset 'titles' has versions v1, v2; "
                    f"add v9.toml to {RULES_DIR / 'titles'} or pick one of those")


# -- check ----------------------------------------------------------------------------------------

BAD = '''format_version = 1
[titles.aliases]
"Software Engineer" = ["swe"]
"Senior Software Engineer" = ["SWE"]
'''


def test_check_a_valid_file_is_one_ok_line(run):
    path = RULES_DIR / "titles" / "v2.toml"
    res = run("rules", "check", str(path))
    rules = load_rules(path)
    titles, companies = rules.fields["titles"], rules.fields["companies"]
    assert res.exit_code == 0 and res.stderr == ""
    assert res.stdout == (f"ok: {path}: rules v2 ([titles] {len(titles.lookup)} spellings, {len(titles.regex)} regex "
                          f"rules; [companies] {len(companies.lookup)} spellings, 0 regex rules), hash "
                          f"{rules.content_hash[:12]}\n")


@pytest.fixture
def rules_dir(tmp_path, monkeypatch):
    """A rules directory deploy reads from: the repo's titles files, and room for more."""
    root = tmp_path / "rules"
    shutil.copytree(RULES_DIR / "titles", root / "titles")
    monkeypatch.setattr(rules_mod, "RULES_DIR", root)
    return root


def test_check_gives_the_error_deploy_gives(k, run, rules_dir):
    from orchestrator.lifecycle.deploy import check_request

    bad = rules_dir / "titles" / "v3.toml"
    bad.write_text(BAD)
    with pytest.raises(RulesError) as deploy_error:
        check_request(k, k.pipeline(PIPELINE), "v3")
    line = one_error_line(run("rules", "check", str(bad)))
    assert line == error_line(deploy_error.value)
    assert line == (f"Error: rules file {bad}: titles.aliases[\"Senior Software Engineer\"][0] (line 4): spelling "
                    f"'SWE' (normalised 'swe') maps to 'Senior Software Engineer' but titles.aliases[\"Software "
                    f"Engineer\"][0] already maps it to 'Software Engineer'; a spelling must map to one canonical "
                    f"value: remove one of them")


def test_check_refuses_a_rules_file_name_deploy_cannot_pick(run, rules_dir):
    odd = rules_dir / "titles" / "V3 final.toml"
    shutil.copy(rules_dir / "titles" / "v2.toml", odd)
    line = one_error_line(run("rules", "check", str(odd)))
    assert line.startswith("Error: invalid rules version 'V3 final': expected lowercase letters, digits")


def test_check_many_files_reports_each_and_fails_if_one_is_bad(run, tmp_path):
    bad, missing = tmp_path / "bad.toml", tmp_path / "missing.toml"
    bad.write_text("format_version = 3\n[titles]\n")
    good = RULES_DIR / "titles" / "v1.toml"
    res = run("rules", "check", str(good), str(bad), str(missing))
    assert res.exit_code == 1
    assert res.stdout.startswith(f"ok: {good}: rules v1 ") and len(res.stdout.splitlines()) == 1
    assert res.stderr.splitlines() == [
        f"Error: rules file {bad}: format_version (line 1): unsupported value 3; this kappa reads format_version = 1 "
        f"or 2",
        f"Error: rules file {missing} does not exist; pass an existing file with --rules"]
    as_json = json.loads(run("rules", "check", str(good), str(bad), "--json").stdout)
    assert [(r["file"], r["ok"]) for r in as_json] == [(str(good), True), (str(bad), False)]
    assert as_json[0]["hash"] == load_rules(good).content_hash


# -- the team's rules location, diff, status ---------------------------------------------------------

@pytest.fixture
def team(home, tmp_path, monkeypatch):
    """A team's rules folder named by `rules_location` in the home's kappa.toml; deploys allocate only."""
    from orchestrator.lifecycle import deploy as deploy_mod

    root = tmp_path / "team" / "rules"
    shutil.copytree(RULES_DIR / "titles", root / "titles")
    home.mkdir(parents=True, exist_ok=True)
    (home / "kappa.toml").write_text('rules_location = "../team/rules"\n')
    monkeypatch.setattr(deploy_mod, "_topic_policies", lambda k, topics: {t: ("compact", False) for t in topics})
    return root


def _deploy(home, rules_version: str) -> int:
    from orchestrator.context import Kappa
    from orchestrator.core.settings import resolve_settings
    from orchestrator.lifecycle.deploy import deploy

    with Kappa(resolve_settings(home=str(home), env={})) as kk:
        return deploy(kk, kk.pipeline(PIPELINE), rules_version, actor="alice", reason="r", start=False, queue=True).version


def test_rules_diff_prints_what_changed_between_two_deployed_versions(run, team, home):
    v1, v2 = _deploy(home, "v1"), _deploy(home, "v2")
    res = run("rules", "diff", PIPELINE, f"v{v1}", str(v2))
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    h1 = load_rules(team / "titles" / "v1.toml").content_hash[:12]
    h2 = load_rules(team / "titles" / "v2.toml").content_hash[:12]
    assert lines[0] == f"rules of {PIPELINE} v{v1} (v1, {h1}) and v{v2} (v2, {h2}): the rules differ"
    assert lines[1] == f"--- {PIPELINE} v{v1} (rules v1, {h1})"
    assert any(line.startswith("+") and "Senior Software Engineer" in line for line in lines[3:])
    res = run("rules", "diff", PIPELINE, "one", "v2")             # a usage error, as for every verb: exit 2
    assert res.exit_code == 2 and res.stderr.splitlines()[-1] == (
        "Error: Invalid value for OLD: 'one' is not a version; write a version number such as 2 or v2")
    assert one_error_line(run("rules", "diff", PIPELINE, str(v1), "9")) == (
        f"Error: pipeline {PIPELINE!r} has no version v9 (versions: v{v1}, v{v2}); see kappa status {PIPELINE}")


def test_status_says_when_a_versions_rules_file_was_edited_since_its_deploy(run, team, home):
    v1 = _deploy(home, "v1")
    path = team / "titles" / "v1.toml"
    path.write_text(path.read_text(encoding="utf-8").replace('"Software Engineer" = [', '"Software Eng." = ['),
                    encoding="utf-8")
    res = run("status", PIPELINE, "--json")
    assert res.exit_code == 0, res.stderr
    (row,) = json.loads(res.stdout)["pipelines"][0]["versions"]
    assert (row["version"], row["rules_version"], row["rules_file"]) == (v1, "v1", "changed")
    res = run("status", PIPELINE)
    assert "v1 (file edited since deploy)" in res.stdout
    assert "rules file edited since deploy: v1 (each version runs the rules stored at its deploy" in " ".join(
        res.stdout.split())


def test_check_finds_a_file_of_the_rules_location_as_deploy_does(run, team):
    odd = team / "titles" / "V3.toml"
    shutil.copy(team / "titles" / "v2.toml", odd)
    line = one_error_line(run("rules", "check", str(odd)))
    assert line.startswith("Error: invalid rules version 'V3': expected lowercase letters, digits")
    res = run("rules", "check", str(team / "titles" / "v1.toml"))
    assert res.exit_code == 0 and res.stdout.startswith(f"ok: {team / 'titles' / 'v1.toml'}: rules v1 ")


def test_check_with_a_pipeline_checks_its_sql_as_deploy_does(run, tmp_path):
    """`kappa rules check --pipeline P`: a pipeline's checks that do not parse are refused in one line,
    exit 1; good ones say what they were checked against (no table yet: parsed only)."""
    pipelines = tmp_path / "pipelines.toml"
    base = ('[pipelines.p]\njob = "standardize"\ntopics = ["t"]\nkey = "member_id"\nruleset = "titles"\n'
            'alias = "p_live"\n[[pipelines.p.checks]]\nname = "nulls"\nmax = 0.01\nsql = "{sql}"\n')
    pipelines.write_text(base.format(sql="SELECT avg(CASE WHEN title IS NULL THEN 1.0 ELSE 0 END) FROM candidate"))
    res = run("--pipelines-file", str(pipelines), "rules", "check", "--pipeline", "p")
    assert res.exit_code == 0 and res.stdout == "ok: pipeline p: 1 checks parse (no table yet to check their columns against)\n"
    pipelines.write_text(base.format(sql="SELEC avg(title) FROM candidate"))
    res = run("--pipelines-file", str(pipelines), "rules", "check", "--pipeline", "p")
    assert res.exit_code == 1
    assert one_error_line(res).startswith("Error: pipeline 'p', check 'nulls': Parser Error: syntax error at or near "
                                          "\"SELEC\""), res.stderr
