"""Registry URLs as people type them, and one line that says what to fix for every bad setting."""

from __future__ import annotations

import pytest

from orchestrator.core.exceptions import ConfigError
from orchestrator.core.settings import CLI_FLAGS, ENV_VARS, Settings, resolve_settings
from orchestrator.registry.engine import registry_url


@pytest.mark.parametrize("typed", ["postgresql://kappa:pw@db:5432/kappa", "postgres://kappa:pw@db:5432/kappa",
                                   "postgresql+psycopg2://kappa:pw@db:5432/kappa"])
def test_postgresql_without_a_driver_means_psycopg2(tmp_path, typed):
    """SQLAlchemy picks psycopg 3 for postgresql://, which is not installed: a traceback before."""
    s = resolve_settings(env={"KAPPA_REGISTRY_URL": typed}, cwd=tmp_path)
    assert s.registry_url == "postgresql+psycopg2://kappa:pw@db:5432/kappa"
    assert registry_url(typed).drivername == "postgresql+psycopg2"
    assert registry_url("sqlite:///x.db").drivername == "sqlite"


@pytest.mark.parametrize("url,driver,plain", [
    ("postgresql+psycopg://kappa:s3cret@db/kappa", "psycopg", "postgresql://kappa:***@db/kappa"),
    ("postgresql+asyncpg://kappa@db/kappa", "asyncpg", "postgresql://kappa@db/kappa"),
    ("sqlite+aiosqlite:///x.db", "aiosqlite", "sqlite:///x.db"),
])
def test_a_driver_kappa_does_not_install_gets_one_line(tmp_path, url, driver, plain):
    with pytest.raises(ConfigError) as e:
        resolve_settings(env={}, cwd=tmp_path, registry_url=url)
    msg = str(e.value)
    assert "\n" not in msg and "s3cret" not in msg
    assert f"does not install the driver '{driver}'; write {plain}; fix the --registry-url flag" in msg
    with pytest.raises(ConfigError) as e:       # the Registry's own check (a URL given to Registry())
        registry_url(url)
    assert "\n" not in str(e.value) and "s3cret" not in str(e.value)
    assert f"names the driver '{driver}', which kappa does not install or use; write '{plain}'" in str(e.value)


@pytest.mark.parametrize("field", ["lag_sample_retention_seconds", "readiness_window_seconds"])
def test_the_seconds_settings_come_from_env_or_file_with_one_line_errors(tmp_path, field):
    var = ENV_VARS[field]
    assert field not in CLI_FLAGS
    assert getattr(resolve_settings(env={var: "90"}, cwd=tmp_path), field) == 90.0
    cfg = tmp_path / "kappa.toml"
    cfg.write_text(f"{field} = 120\n")
    s = resolve_settings(cfg, env={}, cwd=tmp_path)
    assert (getattr(s, field), s.source_of(field)) == (120.0, f"config file {cfg}")
    assert s.to_env()[var] == "120.0"
    for bad in ("0", "-5", "soon", "inf"):
        with pytest.raises(ConfigError) as e:
            resolve_settings(env={var: bad}, cwd=tmp_path)
        assert str(e.value) == (f"invalid setting {field}={bad!r} (from {var}): expected a positive number of "
                                f"seconds, e.g. 3600; fix or unset the environment variable {var}")
    defaults = Settings(home=tmp_path)
    assert (defaults.lag_sample_retention_seconds, defaults.readiness_window_seconds) == (259200.0, 300.0)
