"""`kappa init DIR`: a working project of a team's own, outside kappa's package.

    DIR/.kappa/kappa.toml        settings: the pipelines file, the rules location and the job path below
    DIR/pipelines.toml           one pipeline, `profiles`, running the team's job
    DIR/rules/titles/v1.toml     one ruleset (kappa's shipped titles v1, to edit)
    DIR/team_jobs/profiles.py    the job, following the job contract (`jobs.lib.contract.api`)
    DIR/tests/test_profiles.py   a test of the job with kappa's helpers (`jobs.lib.contract.testing`)
    DIR/conftest.py              so that `pytest tests` in DIR imports team_jobs

Commands run in DIR find the settings (`<home>/kappa.toml`, home `./.kappa`); its relative paths are
read from the file's folder. Nothing existing is overwritten: a file already there is an error.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.core.exceptions import ConfigError

__all__ = ["PROJECT_FILES", "write_project"]

KAPPA_TOML = '''\
# kappa's settings for this project (`kappa --help` lists them all). Relative paths are read from
# this file's folder.
pipelines_file = "../pipelines.toml"
rules_location = "../rules"
job_path = [".."]
'''

PIPELINES_TOML = '''\
# The project's pipelines. `job` is module:function on the job path (kappa.toml's job_path).
[pipelines.profiles]
job = "team_jobs.profiles:transform"
topics = ["member_profiles"]
key = "member_id"
ruleset = "titles"                # rules/titles/<version>.toml
alias = "team_profiles"
catchup_threshold = 100
'''

JOB = '''\
"""Member profiles with standardized titles: a job of kappa's job contract (jobs.lib.contract.api).

kappa gives `transform` the Kafka stream of the pipeline's topics and the rules of the version; the
job returns one row per record (or its reject reason in `error`); kappa keeps the latest row of
each member, calls `then` on it and upserts it into the version's table.
"""

from pyspark.sql import functions as F

from jobs.lib.contract.api import JobInput, Upserts

PROFILE = "name string, title string"


def transform(job: JobInput) -> Upserts:
    value = F.col("value").cast("string")
    profile = F.from_json(value, PROFILE)
    malformed = F.col("value").isNotNull() & (profile.isNull() | profile["name"].isNull())
    rows = job.source.select(
        "*",                                             # kappa needs the source's columns
        F.col("key").cast("string").alias("member_id"),
        profile["name"].alias("name"),
        profile["title"].alias("title_raw"),
        F.when(malformed, F.concat(F.lit("not a profile: "), value)).alias("error"),
        F.col("value").isNull().alias("_deleted"),       # a tombstone deletes the member
    )
    # the rules (rules/titles/<version>.toml, as stored with the version) on each member's latest row:
    # every section on its column, here [titles] on title (title_raw -> title)
    return Upserts(rows, then=job.rules.apply)
'''

TEST = '''\
"""The job on a few records, without Kafka: `pytest tests` in the project's folder."""

from pathlib import Path

from jobs.lib.contract.testing import local_spark, record, run_job
from team_jobs.profiles import transform

RULES = Path(__file__).resolve().parents[1] / "rules" / "titles" / "v1.toml"


def test_the_latest_profile_of_each_member_with_its_title_standardized():
    table, rejects = run_job(local_spark(), transform, [
        record("m1", {"name": "Ada", "title": "swe"}),
        record("m2", {"name": "Grace", "title": "Data Scientist"}),
        record("m1", {"name": "Ada", "title": "software eng"}),
        record("m2", None),                                  # Grace deleted her profile
        record("m3", "{not json"),
    ], key="member_id", rules=RULES)
    assert table == [{"member_id": "m1", "name": "Ada", "title_raw": "software eng", "title": "Software Engineer"}]
    assert [(r["offset"], r["error"]) for r in rejects] == [(4, "not a profile: {not json")]
'''

PROJECT_FILES = (".kappa/kappa.toml", "pipelines.toml", "rules/titles/v1.toml", "team_jobs/__init__.py",
                 "team_jobs/profiles.py", "tests/test_profiles.py", "conftest.py")


def _format_2(text: str) -> str:
    """kappa's shipped titles v1 (format 1) as format 2: each section names its column."""
    text = text.replace("format_version = 1", "format_version = 2", 1)
    for section, column in (("titles", "title"), ("companies", "company")):
        text = text.replace(f"\n[{section}]\n", f"\n[{section}]\ncolumn = \"{column}\"\n", 1)
    return text


def write_project(folder: str | Path) -> list[Path]:
    """Write the project into `folder` (created if missing); ConfigError, and nothing written, when
    any of its files exists already. Returns the files written."""
    from jobs.lib.rules.files import rules_path

    root = Path(folder).expanduser().resolve()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root} is a file; name a folder for the new project")
    there = [p for p in PROJECT_FILES if (root / p).exists()]
    if there:
        raise ConfigError(f"{root} already has {', '.join(there)}; kappa init writes a new project and overwrites "
                          f"nothing: pick an empty folder")
    contents = {".kappa/kappa.toml": KAPPA_TOML, "pipelines.toml": PIPELINES_TOML,
                "rules/titles/v1.toml": _format_2(rules_path("titles", "v1").read_text(encoding="utf-8")),
                "team_jobs/__init__.py": "", "team_jobs/profiles.py": JOB, "tests/test_profiles.py": TEST,
                "conftest.py": "# pytest puts this folder on sys.path, so that tests import team_jobs\n"}
    written = []
    for name in PROJECT_FILES:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(contents[name], encoding="utf-8")
        written.append(path)
    return written
