"""`--registry-url postgresql://user@host/db` (no driver) against the machine's PostgreSQL: it works, from
the CLI and from `Registry`, and a driver kappa does not install is one line, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchestrator.context import Kappa
from orchestrator.core.settings import resolve_settings
from orchestrator.registry import Registry

pytestmark = pytest.mark.integration


def _kappa(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "--home", str(tmp_path / "home"), *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_a_url_without_a_driver_reaches_postgresql(tmp_path, postgres_url, scheme):
    typed = scheme + "://" + postgres_url.split("://", 1)[1]       # postgresql://postgres@127.0.0.1:5432/<db>
    proc = _kappa(tmp_path, "--registry-url", typed, "status")
    assert proc.returncode == 0, proc.stdout + proc.stderr        # was: ModuleNotFoundError 'psycopg'
    assert "Traceback" not in proc.stderr and "no pipeline has a version yet" in proc.stdout
    with Registry(typed) as reg:                                   # the schema the CLI created
        assert reg.dialect == "postgresql" and reg.list_pipelines() == []
    with Kappa(resolve_settings(env={}, cwd=tmp_path, registry_url=typed)) as k:
        assert k.registry.schema_version() >= 2


def test_a_driver_kappa_does_not_install_is_one_line(tmp_path, postgres_url):
    typed = "postgresql+psycopg://" + postgres_url.split("://", 1)[1]
    proc = _kappa(tmp_path, "--registry-url", typed, "status")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    (line,) = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert "does not install the driver 'psycopg'; write postgresql://" in line
    assert line.endswith("fix the --registry-url flag")
