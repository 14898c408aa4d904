"""Files kappa ships besides its code: the default pipelines file, the Airflow DAGs folder and the
Maven projects that pin its JARs (`deploy/jars/<set>/pom.xml`).

In a checkout (and an editable install) they are the repository's `deploy/pipelines.toml` and
`dags/`. A regular install has no checkout to point at, so the build copies them into the
package as `orchestrator/_data/pipelines.toml` and `orchestrator/_data/dags/` (see `setup.py`);
these functions return the copy when there is one, so `kappa pipelines`, `kappa demo` and
`kappa airflow start` work from any directory either way.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["PACKAGE_DATA", "checkout_root", "dags_folder", "default_pipelines_file", "jars_pom"]

#: Where the build puts the shipped files inside the installed package.
PACKAGE_DATA = Path(__file__).resolve().parents[1] / "_data"


def checkout_root() -> Path:
    """The repository a checkout or editable install runs from (meaningless in a regular install)."""
    return Path(__file__).resolve().parents[2]


def _shipped(packaged: Path, in_checkout: Path) -> Path:
    return packaged if packaged.exists() else in_checkout


def default_pipelines_file() -> Path:
    """The pipelines file used when neither --pipelines-file, KAPPA_PIPELINES nor kappa.toml names one."""
    return _shipped(PACKAGE_DATA / "pipelines.toml", checkout_root() / "deploy" / "pipelines.toml")


def dags_folder() -> Path:
    """The folder of kappa's Airflow DAG files (Airflow's `dags_folder`)."""
    return _shipped(PACKAGE_DATA / "dags", checkout_root() / "dags")


def jars_pom(name: str) -> Path:
    """The Maven project that pins the JAR set `name` (`kafka`, `spark`)."""
    return _shipped(PACKAGE_DATA / "jars" / name / "pom.xml", checkout_root() / "deploy" / "jars" / name / "pom.xml")
