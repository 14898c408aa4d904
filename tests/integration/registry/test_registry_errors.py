"""The registry says what is wrong with its URL or database, naming the setting that fixes it."""

from __future__ import annotations

import pytest
from registry_helpers import allocate

from orchestrator.core.exceptions import ConfigError, RegistryError
from orchestrator.core.net import free_port
from orchestrator.registry import HEAD, Registry

pytestmark = pytest.mark.integration


def test_bad_urls():
    with pytest.raises(ConfigError) as e:
        Registry("not a url")
    assert str(e.value) == ("registry URL 'not a url' is not a database URL; expected sqlite:///<path> or "
                            "postgresql+psycopg2://<user>@<host>:5432/<db> (KAPPA_REGISTRY_URL)")
    with pytest.raises(ConfigError) as e:
        Registry("mysql://kappa:pw@127.0.0.1/kappa")
    assert str(e.value) == ("registry URL 'mysql://kappa:***@127.0.0.1/kappa': the registry runs on SQLite or "
                            "PostgreSQL, not mysql (KAPPA_REGISTRY_URL)")


def test_unreachable_postgres_names_the_url_without_its_password():
    port = free_port()
    with pytest.raises(RegistryError) as e:
        Registry(f"postgresql+psycopg2://kappa:s3cret@127.0.0.1:{port}/kappa", busy_timeout=2)
    msg = str(e.value)
    assert msg.startswith(f"registry postgresql+psycopg2://kappa:***@127.0.0.1:{port}/kappa is unreachable: "
                          f"migrating the schema failed (")
    assert "Connection refused" in msg or "connection" in msg.lower()
    assert msg.endswith("retry the command once the database answers (a retry, or `kappa reconcile`, finishes what "
                        "this one left half done) (KAPPA_REGISTRY_URL)")
    assert "\n" not in msg and "locked" not in msg   # one line; a refused connection is no lock
    assert "s3cret" not in msg


def test_sqlite_file_and_its_directory_are_created(tmp_path):
    url = f"sqlite:///{tmp_path / 'new' / 'home' / 'registry.db'}"
    with Registry(url) as reg:
        assert reg.schema_version() == HEAD
        assert allocate(reg).version == 1
    assert (tmp_path / "new" / "home" / "registry.db").is_file()
    with Registry(url) as again:  # reopening an existing registry migrates nothing and keeps the data
        assert again.migrate() == []
        assert [v.version for v in again.list_versions("standardize")] == [1]


def test_in_memory_sqlite_for_dry_runs():
    with Registry("sqlite://") as reg:
        assert allocate(reg).version == 1
        assert reg.get_version("standardize", 1).state == "created"


def test_sqlite_directory_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RegistryError) as e:
        Registry(f"sqlite:///{blocker / 'sub' / 'registry.db'}")
    assert str(e.value).startswith(f"cannot create the directory of the SQLite registry {blocker / 'sub' / 'registry.db'}: ")
    assert str(e.value).endswith("set KAPPA_HOME or KAPPA_REGISTRY_URL to a writable place")
