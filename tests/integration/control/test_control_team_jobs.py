"""A team's own job and rules, from a folder outside kappa (its repository: the job path and the
rules location), under the job contract (`jobs.lib.contract.api`): deployed with the team's rules
version, caught up, promoted and served by kappa, with its rejects and its tombstones; and the jobs
that break the contract refused at deploy, one line each, the registry unchanged.

The job (`tests/team_repo.py`) uses nothing of kappa's but the contract's types; the expected table
is computed from the records produced and the test's own reading of the rules, with no code of the
job's or kappa's.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

from orchestrator.core.exceptions import ConfigError, NotReadyError
from orchestrator.context import Kappa
from orchestrator.core.pipelines import PipelineSpec
from orchestrator.core.settings import Settings
from orchestrator.core.tables import read_table
from orchestrator.dev import datagen
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote
from orchestrator.registry import Registry
from orchestrator.serving import open_alias, resolve_alias
from tests.team_repo import accounts, expected_accounts, write_team_repo
from tests.teardown import kill_jobs

pytestmark = pytest.mark.integration

DEADLINE = float(os.environ.get("KAPPA_TEST_READY_DEADLINE", "900"))
PARTITIONS = 2

#: The team's next job: the same rows without the owner column.
SLIM = ("from jobs.lib.contract.api import Upserts\nfrom team_jobs.accounts import transform as full\n\n"
        "def transform(job):\n    out = full(job)\n    return Upserts(out.rows.drop('owner'), then=out.then)\n")

BROKEN = {
    "team_jobs.raising": ("import json\nraise RuntimeError('the team forgot a dependency')\n",
                          "importing 'team_jobs.raising' failed: RuntimeError: the team forgot a dependency"),
    "team_jobs.shape": ("from jobs.lib.contract.api import Upserts\n\ndef transform(job):\n"
                        "    return Upserts(job.source.select('value'))\n",
                        "rows lack the pipeline's key column(s) account_id (columns: value)"),
    "team_jobs.accounts:build": (None, "module 'team_jobs.accounts' has no function 'build'"),
}


@pytest.fixture
def team(bootstrap, tmp_path, seed):
    unique = uuid.uuid4().hex[:8]
    topic, alias = f"accounts_{unique}", f"accounts_{unique}"
    datagen.ensure_topic(bootstrap, topic, PARTITIONS)
    datagen.produce(bootstrap, topic, accounts(400, 60, seed))
    repo, rules = write_team_repo(tmp_path)
    (repo / "team_jobs" / "slim.py").write_text(SLIM)
    for ref, (code, _) in BROKEN.items():
        if code is not None:
            (repo / "team_jobs" / f"{ref.split('.')[1]}.py").write_text(code)
    home = tmp_path / "kappa"
    reg = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    spec = PipelineSpec(name="accounts", job="team_jobs.accounts:transform", topics=(topic,), key="account_id",
                        ruleset="plans", alias=alias, catchup_threshold=0, max_reject_rate=0.2,
                        key_count_tolerance=0.0)
    k = Kappa(Settings(home=home, bootstrap_servers=bootstrap, job_path=str(repo), rules_location=str(rules)),
              registry=reg, pipelines={"accounts": spec})
    try:
        yield k, topic, alias
    finally:
        kill_jobs(k, ["accounts"])
        k.close()


def test_a_team_job_from_its_own_folder_is_deployed_caught_up_promoted_and_served_exactly(team, bootstrap):
    k, topic, alias = team
    info = deploy(k, k.pipeline("accounts"), "v2", actor="team:ana", reason="our own job, our own rules")
    assert wait_ready(k.version("accounts", info.version), deadline_seconds=DEADLINE, poll_seconds=1).ready
    promote(k.version("accounts", info.version), actor="team:ana", reason="serve it")

    table, rejects = expected_accounts(list(datagen.iter_log(bootstrap, topic)), "v2")
    served = read_table(open_alias(alias, k.settings)).to_pylist()
    assert {r["account_id"]: (r["owner"], r["plan_raw"], r["plan"]) for r in served} == table
    assert len(served) == len(table) > 0
    assert list(served[0]) == ["account_id", "owner", "plan_raw", "plan", "source_partition", "source_offset",
                               "source_timestamp"]
    assert {r["plan"] for r in served} <= {"Free", "Pro", "Business"}
    got = sorted((r["partition"], r["offset"]) for r in read_table(str(k.paths("accounts", info.version).rejects))
                 .to_pylist())
    assert got == rejects and rejects
    launch = json.loads(k.paths("accounts", info.version).launch_file.read_text())
    assert launch["mode"] == "local"
    log = k.paths("accounts", info.version).log_file.read_text(errors="replace")
    assert "--job team_jobs.accounts:transform" in log and "--key account_id" in log

    # the team's next version drops a column readers may use: refused at promote unless allowed
    slim_spec = k.pipeline("accounts").model_copy(update={"job": "team_jobs.slim:transform"})
    slim = Kappa(k.settings, registry=k.registry, pipelines={"accounts": slim_spec})
    v2 = deploy(slim, slim.pipeline("accounts"), "v2", actor="team:ana", reason="owner moves to its own table").version
    assert wait_ready(slim.version("accounts", v2), deadline_seconds=DEADLINE, poll_seconds=1).ready
    with pytest.raises(NotReadyError) as e:
        promote(slim.version("accounts", v2), actor="team:ana", reason="drop owner")
    assert str(e.value) == (
        f"cannot promote accounts v{v2} to alias {alias!r}: schema: columns removed: owner (v{info.version} -> "
        f"v{v2}); readers of the alias may break: promote with --allow-schema-change if meant")
    assert resolve_alias(alias, k.settings)["version"] == info.version
    res = promote(slim.version("accounts", v2), actor="team:ana", reason="drop owner", allow_schema_change=True)
    assert res.flipped and res.report.columns_removed == ["owner"] and res.report.columns_added == []
    assert res.report.aligned and res.report.rows_changed == 0 and res.report.rows_same_input == len(table)
    assert "owner" not in read_table(open_alias(alias, k.settings)).column_names


@pytest.mark.parametrize("ref", list(BROKEN))
def test_a_team_job_that_breaks_the_contract_is_refused_at_deploy_in_one_line(team, ref):
    k, _topic, _alias = team
    spec = k.pipeline("accounts").model_copy(update={"job": ref})
    broken = Kappa(k.settings, registry=k.registry, pipelines={"accounts": spec})
    with pytest.raises(ConfigError) as e:
        deploy(broken, broken.pipeline("accounts"), None, actor="team:ana", reason="a broken job")
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"pipeline 'accounts', field 'job': job {ref!r}")
    assert BROKEN[ref][1] in message, message
    assert k.registry.list_versions("accounts") == []                     # nothing allocated or started
    [audit] = k.registry.audit_log("accounts", limit=None)                  # the refusal, audited
    assert (audit.action, audit.version, audit.outcome) == ("deploy", None, "refused"), audit
