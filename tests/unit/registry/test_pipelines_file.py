"""The pipelines file: what is declared, and exact errors naming file, pipeline and field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.core.resources import default_pipelines_file
from orchestrator.core.exceptions import ConfigError
from orchestrator.core.pipelines import PipelineSpec, check_ruleset_exists, load_pipelines
from orchestrator.jobctl.jobcheck import check_job_exists, check_pipeline_code

BASE = {
    "job": '"standardize"',
    "topics": '["member_profiles"]',
    "key": '"member_id"',
    "ruleset": '"titles"',
    "alias": '"member_profiles_std"',
    "catchup_threshold": "0",
}


def pipelines_file(tmp_path: Path, *tables: tuple[str, dict[str, str | None]], head: str = "") -> Path:
    """Write a pipelines file; each table is (name, overrides of BASE; None drops a field)."""
    lines = [head]
    for name, overrides in tables:
        lines.append(f"[pipelines.{name}]")
        fields = {**BASE, **overrides}
        lines += [f"{k} = {v}" for k, v in fields.items() if v is not None]
    path = tmp_path / "pipelines.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def load_error(path: Path) -> str:
    with pytest.raises(ConfigError) as e:
        load_pipelines(path)
    return str(e.value)


def test_repo_pipelines_file_declares_the_seed_jobs():
    specs = load_pipelines(default_pipelines_file())
    assert list(specs) == ["standardize", "pageviews_hourly", "profile_settings_join", "pageview_enrich",
                           "ad_click_join"]
    std = specs["standardize"]
    assert (std.name, std.job, std.topics, std.key, std.ruleset, std.alias) == (
        "standardize", "standardize", ("member_profiles",), "member_id", "titles", "member_profiles_std")
    assert (std.catchup_threshold, std.catchup_samples, std.grace_period_seconds, std.keep_versions,
            std.key_count_tolerance, std.max_reject_rate, std.max_records_per_batch) == (
        1000, 3, 300.0, 3, 0.05, 0.01, 500000)
    assert {name: (s.job, s.topics) for name, s in specs.items() if name != "standardize"} == {
        "pageviews_hourly": ("pageviews_hourly", ("page_views",)),
        "profile_settings_join": ("profile_settings_join", ("member_profiles", "member_settings")),
        "pageview_enrich": ("pageview_enrich", ("page_views", "member_profiles")),
        "ad_click_join": ("ad_click_join", ("ad_impressions", "ad_clicks")),
    }
    assert all(s.ruleset is None for name, s in specs.items() if name != "standardize")
    assert len({s.alias for s in specs.values()}) == len(specs)
    assert specs["pageviews_hourly"].key_columns == ("member_id", "window_start")


def test_defaults_and_options(tmp_path):
    path = pipelines_file(tmp_path, ("p", {"ruleset": None}),
                          head="")
    path.write_text(path.read_text() + "[pipelines.p.options]\nwindow = \"1 hour\"\n")
    spec = load_pipelines(path)["p"]
    assert spec.ruleset is None and not spec.uses_rules
    assert (spec.catchup_samples, spec.keep_versions, spec.max_records_per_batch) == (3, 3, 100000)
    assert spec.options == {"window": "1 hour"}
    assert spec.model_dump(mode="json")["key_columns"] == ["member_id"]


def test_spec_is_frozen(tmp_path):
    spec = load_pipelines(pipelines_file(tmp_path, ("p", {})))["p"]
    with pytest.raises(ValidationError):
        spec.catchup_threshold = 5  # type: ignore[misc]


@pytest.mark.parametrize("field,value,expected", [
    ("catchup_threshold", "-1",
     "field 'catchup_threshold': Input should be greater than or equal to 0 (got -1)"),
    ("catchup_threshold", '"10"', "field 'catchup_threshold': Input should be a valid integer (got '10')"),
    ("catchup_threshold", "true", "field 'catchup_threshold': Input should be a valid integer (got True)"),
    ("catchup_threshold", "1.5", "field 'catchup_threshold': Input should be a valid integer (got 1.5)"),
    ("catchup_samples", "0", "field 'catchup_samples': Input should be greater than or equal to 1 (got 0)"),
    ("key_count_tolerance", "1.5",
     "field 'key_count_tolerance': Input should be less than or equal to 1 (got 1.5)"),
    ("max_reject_rate", "-0.1", "field 'max_reject_rate': Input should be greater than or equal to 0 (got -0.1)"),
    ("grace_period_seconds", "-5",
     "field 'grace_period_seconds': Input should be greater than or equal to 0 (got -5)"),
    ("topics", '"member_profiles"',
     "field 'topics': must be a list of topic names, e.g. [\"member_profiles\"] (got 'member_profiles')"),
    ("topics", "[]", "field 'topics': must name at least one topic (got [])"),
    ("topics", '["a", "a"]', "field 'topics': lists 'a' more than once (got ['a', 'a'])"),
    ("topics", '["a,b"]',
     "field 'topics': invalid topic name 'a,b': must be 1 to 249 characters from a-z, A-Z, 0-9, '.', '_', '-', "
     "and not '.' or '..' (Kafka's rule) (got ['a,b'])"),
    ("alias", '"Member Profiles"',
     "field 'alias': invalid alias name 'Member Profiles': must be a lowercase letter followed by at most 62 "
     "lowercase letters, digits or underscores (^[a-z][a-z0-9_]{0,62}$) (got 'Member Profiles')"),
    ("job", '"../evil"',
     "field 'job': invalid job '../evil': name a Python module or module:function, such as "
     "team_jobs.profiles:transform, or one of kappa's jobs such as standardize (got '../evil')"),
    ("ruleset", '"Titles"',
     "field 'ruleset': invalid ruleset name 'Titles': must be a lowercase letter followed by at most 62 "
     "lowercase letters, digits or underscores (^[a-z][a-z0-9_]{0,62}$) (got 'Titles')"),
    ("key", '"member id"',
     "field 'key': column 'member id' is not a valid column name (letters, digits, underscores, not starting "
     "with a digit) (got 'member id')"),
])
def test_bad_field_errors(tmp_path, field, value, expected):
    path = pipelines_file(tmp_path, ("standardize", {field: value}))
    assert load_error(path) == f"pipelines file {path}: pipeline 'standardize', {expected}"


def test_missing_field(tmp_path):
    path = pipelines_file(tmp_path, ("standardize", {"alias": None}))
    assert load_error(path) == (f"pipelines file {path}: pipeline 'standardize', field 'alias': required but "
                                f"missing; add it to [pipelines.standardize]")


def test_unknown_field(tmp_path):
    path = pipelines_file(tmp_path, ("standardize", {"catchup_treshold": "5"}))
    assert load_error(path) == (
        f"pipelines file {path}: pipeline 'standardize', field 'catchup_treshold': unknown field; known fields: "
        f"job, topics, key, alias, ruleset, catchup_threshold, catchup_seconds, catchup_samples, "
        f"grace_period_seconds, stop_timeout_seconds, "
        f"keep_versions, key_count_tolerance, max_reject_rate, max_records_per_batch, max_restarts, "
        f"restart_window_seconds, restart_backoff_seconds, restart_backoff_max_seconds, description, options, checks, auto_rollback, watch_max_lag_seconds, watch_lag_samples, watch_on_rollback, "
            f"backfill_share, backfill_adaptive, backfill_lag_bound_seconds, backfill_interval_seconds")


def test_several_errors_in_one_pipeline_are_all_named(tmp_path):
    path = pipelines_file(tmp_path, ("standardize", {"catchup_threshold": "-1", "keep_versions": "0"}))
    assert load_error(path) == (
        f"pipelines file {path}: pipeline 'standardize', field 'catchup_threshold': Input should be greater than "
        f"or equal to 0 (got -1); pipelines file {path}: pipeline 'standardize', field 'keep_versions': Input "
        f"should be greater than or equal to 1 (got 0)")


def test_duplicate_alias(tmp_path):
    path = pipelines_file(tmp_path, ("standardize", {}), ("standardize2", {}))
    assert load_error(path) == (
        f"pipelines file {path}: pipeline 'standardize2', field 'alias': alias 'member_profiles_std' is already "
        f"the alias of pipeline 'standardize'; every pipeline needs its own alias")


def test_bad_pipeline_name(tmp_path):
    path = pipelines_file(tmp_path, ('"Standardize"', {}))
    assert load_error(path) == (
        f"pipelines file {path}: [pipelines.Standardize]: invalid pipeline name 'Standardize': must be a "
        f"lowercase letter followed by at most 62 lowercase letters, digits or underscores (^[a-z][a-z0-9_]{{0,62}}$)")


def test_name_field_is_refused(tmp_path):
    path = pipelines_file(tmp_path, ("standardize", {"name": '"other"'}))
    assert load_error(path) == (f"pipelines file {path}: pipeline 'standardize', field 'name': the name is the "
                                f"table's key ([pipelines.standardize]); remove 'name'")


def test_file_level_errors(tmp_path):
    missing = tmp_path / "nope.toml"
    assert load_error(missing) == (f"pipelines file {missing} does not exist; set KAPPA_PIPELINES or "
                                   f"--pipelines-file to the file that declares your pipelines")
    bad = tmp_path / "bad.toml"
    bad.write_text("[pipelines.standardize\n")
    assert load_error(bad).startswith(f"pipelines file {bad} is not valid TOML: ")
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing\n")
    assert load_error(empty) == f"pipelines file {empty} declares no pipelines; add a [pipelines.<name>] table"
    top = pipelines_file(tmp_path, ("standardize", {}), head='version = 2')
    assert load_error(top) == (f"pipelines file {top}: unknown top-level key(s) 'version'; declare each "
                               f"pipeline as a [pipelines.<name>] table")
    scalar = tmp_path / "scalar.toml"
    scalar.write_text("[pipelines]\nstandardize = 1\n")
    assert load_error(scalar) == (f"pipelines file {scalar}: pipeline 'standardize' must be a table "
                                  f"([pipelines.standardize]), got int")


def test_nothing_is_loaded_when_one_pipeline_is_bad(tmp_path):
    path = pipelines_file(tmp_path, ("good", {"alias": '"a1"'}), ("bad", {"alias": '"a2"', "keep_versions": "0"}))
    with pytest.raises(ConfigError, match="pipeline 'bad', field 'keep_versions'"):
        load_pipelines(path)


# -- code checks: the job imports and keeps the contract; the ruleset exists -----------------

@pytest.fixture
def code_dirs(tmp_path):
    """A team's repository: a package of job modules (good and bad ones) and a rules folder."""
    repo = tmp_path / "team-repo"
    (repo / "rules" / "titles").mkdir(parents=True)
    (repo / "rules" / "titles" / "v1.toml").write_text("")
    (repo / "rules" / "empty").mkdir()
    pkg = repo / "team_jobs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "profiles.py").write_text("def transform(job):\n    return job\n\ndef two(job, extra):\n    pass\n"
                                     "LIMIT = 3\n")
    (pkg / "broken.py").write_text("import json\n1 / 0\n")
    return repo


def spec_with(job: str) -> PipelineSpec:
    return PipelineSpec(name="p", job=job, topics=["t"], key="k", alias="a")


def test_code_checks_pass(tmp_path, code_dirs):
    path = pipelines_file(tmp_path, ("standardize", {"job": '"team_jobs.profiles"'}))
    spec = load_pipelines(path)["standardize"]
    check_pipeline_code(spec, job_path=[str(code_dirs)], rules_dir=code_dirs / "rules")
    assert check_job_exists(spec, job_path=[str(code_dirs)]) == "team_jobs.profiles:transform"
    assert check_ruleset_exists(spec, rules_dir=code_dirs / "rules") == code_dirs / "rules" / "titles"
    # kappa's own jobs by name, found as files
    assert check_job_exists(spec_with("standardize")) == "jobs.standardize:transform"


@pytest.mark.parametrize("job, message", [
    ("lib", "job 'lib' is none of kappa's jobs (ad_click_join, pageview_enrich, pageviews_hourly, "
            "profile_settings_join, standardize) and no job_path is set to import it from; set job_path "
            "(--job-path, KAPPA_JOB_PATH) to the folder that holds lib.py"),
    ("team_jobs.nope", "job 'team_jobs.nope': module 'team_jobs.nope' not found (No module named "
                       "'team_jobs.nope'); job path: {repo}. Add the folder that holds it to job_path "
                       "(--job-path, KAPPA_JOB_PATH or kappa.toml), or install it"),
    ("team_jobs.broken", "job 'team_jobs.broken': importing 'team_jobs.broken' failed: ZeroDivisionError: "
                         "division by zero"),
    ("team_jobs.profiles:missing", "job 'team_jobs.profiles:missing': module 'team_jobs.profiles' has no "
                                   "function 'missing'; name it team_jobs.profiles:<function> in the pipelines file"),
    ("team_jobs.profiles:LIMIT", "job 'team_jobs.profiles:LIMIT': team_jobs.profiles.LIMIT is a int, not a function"),
    ("team_jobs.profiles:two", "job 'team_jobs.profiles:two': team_jobs.profiles.two(job, extra) must take exactly "
                               "one argument, the JobInput (def two(job): ...)"),
    ("jobs.lib.runtime.session", "job 'jobs.lib.runtime.session': module 'jobs.lib.runtime.session' has no function 'transform'; name it "
                         "jobs.lib.runtime.session:<function> in the pipelines file"),
])
def test_a_job_that_does_not_import_or_keep_the_contract_is_refused_in_one_line(code_dirs, job, message):
    path = [str(code_dirs)] if "." in job else []
    with pytest.raises(ConfigError) as e:
        check_job_exists(spec_with(job), job_path=path)
    assert str(e.value) == f"pipeline 'p', field 'job': " + message.format(repo=code_dirs)


def test_unknown_ruleset(tmp_path, code_dirs):
    path = pipelines_file(tmp_path, ("standardize", {"ruleset": '"empty"'}))
    spec = load_pipelines(path)["standardize"]
    with pytest.raises(ConfigError) as e:
        check_pipeline_code(spec, rules_dir=code_dirs / "rules")
    assert str(e.value) == (
        f"pipeline 'standardize', field 'ruleset': unknown ruleset 'empty': no rules files (*.toml) in "
        f"{code_dirs / 'rules' / 'empty'} (rulesets found: titles); add {code_dirs / 'rules' / 'empty' / 'v1.toml'} "
        f"or fix 'ruleset' in the pipelines file (or rules_location)")


def test_job_without_rules_needs_no_ruleset(tmp_path, code_dirs):
    spec = PipelineSpec(name="p", job="standardize", topics=["t"], key="k", alias="a")
    assert check_ruleset_exists(spec, rules_dir=code_dirs / "nowhere") is None
    check_pipeline_code(spec)
