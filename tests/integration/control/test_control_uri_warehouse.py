"""A whole lifecycle on a warehouse given as a `file://` URI: locations are URIs end to end.

Real standardize jobs (real Spark, real Delta) on the session broker write their tables to
`file://<tmp>/shared/warehouse/<pipeline>/v<N>`; v1, v2 and v3 are deployed, waited for and
promoted in turn, each read by a reader that knows nothing but the warehouse URI and the alias
(the pointer file `<warehouse>/_aliases/<alias>.json`), and v1, no longer protected once v3
serves, is retired: its table, rejects table, checkpoint and run dir are gone, the rest is not.
Nothing is ever written to a path that a URI would become through pathlib (`file:/…`).
"""

from __future__ import annotations

import os
import uuid

import pytest

from orchestrator.core import uris
from orchestrator.context import Kappa
from orchestrator.core.settings import Settings
from orchestrator.dev import datagen
from orchestrator.jobctl import stop_version
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote
from orchestrator.lifecycle.retire import retire
from orchestrator.serving import open_alias, resolve_alias
from tests.pipelines import standardize_pipeline
from orchestrator.core.tables import read_table
from tests.teardown import kill_jobs

pytestmark = pytest.mark.integration

#: JVM start plus a tiny backfill on 2 shared cores: generous, never relied upon for timing.
DEADLINE = float(os.environ.get("KAPPA_TEST_READY_DEADLINE", "900"))
RECORDS, KEYS, PARTITIONS = 200, 70, 2
ACTOR = "ops:uri-warehouse-test"


@pytest.fixture
def bed(bootstrap, tmp_path, seed, monkeypatch):
    unique = uuid.uuid4().hex[:8]
    pipeline, topic = f"uri_{unique}", f"uri_profiles_{unique}"
    alias = f"{pipeline}_served"
    pipelines_file = tmp_path / "pipelines.toml"
    pipelines_file.write_text(standardize_pipeline(pipeline, topic, alias=alias))
    datagen.ensure_topic(bootstrap, topic, partitions=PARTITIONS)
    datagen.produce(bootstrap, topic, datagen.generate_changelog(RECORDS, KEYS, seed=seed))
    monkeypatch.chdir(tmp_path)  # a URI mangled into a relative `file:/…` path would land here
    warehouse = f"file://{tmp_path}/shared/warehouse"
    settings = Settings(home=tmp_path / "home", warehouse=warehouse, pipelines_file=pipelines_file,
                        bootstrap_servers=bootstrap)
    assert settings.warehouse == warehouse   # kept as given: never through pathlib
    k = Kappa(settings)
    try:
        yield k, pipeline, alias, warehouse, tmp_path
    finally:
        kill_jobs(k, [pipeline])
        k.close()


def test_deploy_promote_read_and_retire_on_a_file_uri_warehouse(bed):
    k, p, alias, warehouse, tmp_path = bed
    assert str(k.settings.warehouse) == warehouse
    local_wh = tmp_path / "shared" / "warehouse"
    served: dict[int, int] = {}
    for n in (1, 2, 3):
        info = deploy(k, k.pipeline(p), "v1" if n % 2 else "v2", actor=ACTOR, reason=f"version {n}")
        assert info.version == n and info.table == f"{warehouse}/{p}/v{n}" == k.paths(p, n).table
        wait_ready(k.version(p, n), deadline_seconds=DEADLINE, poll_seconds=1)
        promote(k.version(p, n), actor=ACTOR, reason=f"serve v{n}")
        # a reader: the warehouse URI and the alias, nothing else
        pointer = resolve_alias(alias, k.settings)
        assert (pointer["version"], pointer["table"]) == (n, f"{warehouse}/{p}/v{n}")
        rows = read_table(open_alias(alias, k.settings))
        expected = read_table(str(local_wh / p / f"v{n}"))
        assert rows.num_rows > 0 and rows.sort_by("member_id").equals(expected.sort_by("member_id"))
        served[n] = rows.num_rows
        if n == 2:  # v1, the rollback target now, need not run: one JVM fewer on the shared cores
            stop_version(k.version(p, 1), actor=ACTOR, reason="rollback target, kept stopped")
    assert len(set(served.values())) == 1  # every version reads the same keys

    pointer_file = local_wh / "_aliases" / f"{alias}.json"
    assert k.alias_file(alias) == f"{warehouse}/_aliases/{alias}.json" and pointer_file.is_file()
    assert uris.read_text(k.alias_file(alias)) == pointer_file.read_text()
    old = k.paths(p, 1)
    locations = {"table": old.table, "rejects table": old.rejects, "checkpoint": old.checkpoint}
    assert uris.exists(old.table) and uris.exists(old.checkpoint) and old.version_dir.is_dir()
    result = retire(k.version(p, 1), actor=ACTOR, reason="superseded twice")
    assert f"deleted table {old.table}" in result.done and result.bytes_freed > 0
    assert not any(uris.exists(loc) for loc in locations.values()) and not old.version_dir.exists()
    assert not (local_wh / p / "v1").exists() and not (local_wh / p / "v1__rejects").exists()
    assert k.registry.get_version(p, 1).state == "retired"
    for n in (2, 3):  # the kept versions are untouched
        assert read_table(k.paths(p, n).table).num_rows == served[n]
    assert resolve_alias(alias, k.settings)["version"] == 3
    assert not (tmp_path / "file:").exists()  # no URI was ever taken for a relative path
