"""`kappa deploy --dry-run`: deploy's checks and what it would do, with nothing started or written.

The broker is faked only where deploy asks it for the source topics' cleanup.policy; the registry,
the rules files and the pipelines are the real ones. "Nothing written" is checked from outside: the
registry's rows and audit log, and every file under the kappa home.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.lifecycle import deploy as deploy_mod
from orchestrator.lifecycle.deploy import deploy

PIPELINE = "standardize"


@pytest.fixture
def policies(monkeypatch):
    """The source topics' cleanup.policy as the broker would report it (compacted unless a test says)."""
    found: dict[str, str | None] = {}
    monkeypatch.setattr(deploy_mod, "_topic_policies",
                        lambda k, topics: {t: (found.get(t, "compact"), found.get(t, "compact") is None) for t in topics})
    return found


def files_under(home: Path) -> dict[str, bytes]:
    """Every file under the home with its content; SQLite's own -wal/-shm files (which a reader may leave,
    holding no change) are left out, the database itself is compared through the registry."""
    if not home.exists():
        return {}
    return {str(p.relative_to(home)): p.read_bytes() for p in sorted(home.rglob("*"))
            if p.is_file() and not p.name.endswith(("-wal", "-shm", ".db"))}


def registry_state(k):
    reg = k.registry
    return ([r.model_dump() for r in reg.list_versions(PIPELINE)], [e.model_dump() for e in reg.audit_log(limit=None)],
            [p.model_dump() for p in reg.list_pipelines()])


def run_dry(run, *args: str):
    return run("--bootstrap-servers", "127.0.0.1:9", "deploy", PIPELINE, *args, "--dry-run")


def test_on_a_fresh_home_it_would_deploy_v1_and_creates_nothing(run, home, policies):
    result = run_dry(run, "--rules", "v1", "--reason", "try it")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "check rules: ok - rules v1 (" in out and "check topics: ok - every source topic exists and is compacted" in out
    assert "check in_flight: ok - no other version of the pipeline is in flight" in out
    assert "dry run: would deploy standardize v1 (rules v1" in out
    assert "  would: allocate standardize v1 with rules v1" in out
    assert "  would: start its job from offset zero: table " in out
    assert "  would: record the deploy by " in out and ": try it" in out
    assert not home.exists()   # not even the registry database


def test_a_version_in_flight_is_a_refusal_exit_3_and_nothing_changes(run, home, kappa, policies):
    kappa.registry.allocate_version(PIPELINE, rules_version="v1", rules_hash="other", code_ref="t",
                                    paths=lambda n: kappa.paths(PIPELINE, n), actor="alice", reason="first")
    kappa.registry.set_state(PIPELINE, 1, "backfilling")
    before, files = registry_state(kappa), files_under(home)
    result = run_dry(run, "--rules", "v2", "--json")
    assert result.exit_code == 3, result.output
    d = json.loads(result.stdout)
    assert (d["dry_run"], d["would_succeed"], d["version"], d["actions"]) == (True, False, 2, [])
    assert d["error"].startswith(f"pipeline '{PIPELINE}' already has v1 in flight (state backfilling); refusing a "
                                 f"second reprocess. Promote or stop v1 first (kappa stop {PIPELINE} 1)")
    assert [c["name"] for c in d["checks"] if not c["ok"]] == ["in_flight"]
    assert registry_state(kappa) == before and files_under(home) == files

    queued = run_dry(run, "--rules", "v2", "--queue", "--json")
    assert queued.exit_code == 0, queued.output
    d = json.loads(queued.stdout)
    assert d["would_succeed"] is True and d["version"] == 2 and d["actions"][0].startswith(f"allocate {PIPELINE} v2 ")
    assert registry_state(kappa) == before and files_under(home) == files


def test_a_topic_that_is_not_compacted_is_refused_unless_forced(run, policies, kappa):
    policies["member_profiles"] = "delete"
    result = run_dry(run, "--rules", "v1")
    assert result.exit_code == 3, result.output
    assert "check topics: FAILED - source topic 'member_profiles' of pipeline 'standardize' has " \
           "cleanup.policy=delete" in result.stdout
    assert "dry run: would refuse. source topic 'member_profiles'" in result.stdout
    assert "would:" not in result.stdout
    forced = run_dry(run, "--rules", "v1", "--force")
    assert forced.exit_code == 0, forced.output
    assert "dry run: would deploy standardize v1" in forced.stdout
    assert forced.stderr.startswith("warning: source topic 'member_profiles'") and "(forced)" in forced.stderr
    assert kappa.registry.audit_log() == [] and kappa.registry.list_versions(PIPELINE) == []


def test_a_same_rules_version_never_started_would_be_resumed(run, kappa, policies):
    plan = deploy_mod.check_request(kappa, kappa.pipeline(PIPELINE), "v1")
    kappa.registry.allocate_version(PIPELINE, rules_version="v1", rules_hash=plan.rules_hash, code_ref="t",
                                    paths=lambda n: kappa.paths(PIPELINE, n), actor="alice", reason="died")
    result = run_dry(run, "--rules", "v1")
    assert result.exit_code == 0, result.output
    assert "dry run: would resume the deploy of standardize v1" in result.stdout
    assert "  would: start the job of standardize v1 (resume its deploy" in result.stdout
    assert [r.state for r in kappa.registry.list_versions(PIPELINE)] == ["created"]


def test_errors_stay_errors_and_wait_is_a_usage_error(run, policies):
    unknown = run("--bootstrap-servers", "127.0.0.1:9", "deploy", "nosuch", "--dry-run")
    assert unknown.exit_code == 1 and unknown.stderr.startswith("Error: unknown pipeline 'nosuch'")
    bad_rules = run_dry(run, "--rules", "v9")
    assert bad_rules.exit_code == 1 and "v9" in bad_rules.stderr and len(bad_rules.stderr.splitlines()) == 1
    waiting = run_dry(run, "--wait")
    assert waiting.exit_code == 2 and "drop --wait" in waiting.output


def test_the_preview_names_the_version_the_deploy_then_allocates(kappa, policies):
    kappa.registry.allocate_version(PIPELINE, rules_version="v1", rules_hash="h", code_ref="t",
                                    paths=lambda n: kappa.paths(PIPELINE, n), actor="a", reason="r")
    kappa.registry.set_state(PIPELINE, 1, "stopped")
    preview = deploy(kappa, kappa.pipeline(PIPELINE), "v2", actor="bob", dry_run=True)
    assert preview.would_succeed and preview.version == 2 and not preview.resumed
    assert kappa.registry.audit_log(action="deploy") == []
    info = deploy(kappa, kappa.pipeline(PIPELINE), "v2", actor="bob", start=False)
    assert info.version == preview.version and info.table in preview.actions[1]
