"""Ships the default pipelines file and the Airflow DAGs inside the package.

Everything else about the build is in pyproject.toml. `deploy/pipelines.toml` and `dags/*.py`
live at the top of the repository, where an operator looks for them, so a regular (non-editable)
install copies them to `orchestrator/_data/`, where `orchestrator.core.resources` finds them. An
editable install runs from the checkout and reads them in place.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: (source in the repository, destination in the package), relative paths.
SHIPPED = [("deploy/pipelines.toml", "orchestrator/_data/pipelines.toml")] + [
    (f"deploy/jars/{p.parent.name}/pom.xml", f"orchestrator/_data/jars/{p.parent.name}/pom.xml")
    for p in sorted((ROOT / "deploy" / "jars").glob("*/pom.xml"))] + [
    (f"dags/{p.name}", f"orchestrator/_data/dags/{p.name}") for p in sorted((ROOT / "dags").glob("*.py"))]


class build_py_with_shipped_files(build_py):
    """build_py, plus the shipped files (skipped in an editable build: the checkout has them)."""

    def run(self) -> None:
        super().run()
        if not getattr(self, "editable_mode", False):
            for src, dst in SHIPPED:
                target = Path(self.build_lib, dst)
                self.mkpath(str(target.parent))
                self.copy_file(src, str(target))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        extra = [] if getattr(self, "editable_mode", False) else [str(Path(self.build_lib, d)) for _, d in SHIPPED]
        return super().get_outputs(include_bytecode) + extra

    def get_source_files(self) -> list[str]:
        """An sdist carries the shipped files too, so a wheel built from it has them."""
        return super().get_source_files() + [src for src, _ in SHIPPED]


setup(cmdclass={"build_py": build_py_with_shipped_files})
