"""orchestrator.airflow.assets without services: the alias's Asset, when a flip is announced (and
with what), read back on the downstream side, all through Airflow's own context accessors."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from orchestrator.airflow import assets
from orchestrator.core.exceptions import ConfigError

pytestmark = pytest.mark.airflow

PIPELINES = '''
[pipelines.std_a]
job = "standardize"
topics = ["profiles_a"]
key = "member_id"
ruleset = "titles"
alias = "std_a_served"
'''
TAG = "[airflow kappa_promote run manual__1]"


@pytest.fixture
def k(tmp_path, monkeypatch):
    """A kappa home whose registry has std_a v1 serving and v2 allocated (no jobs, no broker)."""
    from orchestrator.context import Kappa
    from orchestrator.core.settings import Settings

    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(PIPELINES)
    with Kappa(Settings(home=tmp_path / "home", pipelines_file=pipelines)) as kappa:
        for rules, digest in (("v1", "a" * 64), ("v2", "b" * 64)):
            kappa.registry.allocate_version("std_a", rules_version=rules, rules_hash=digest, code_ref=None,
                                            actor="tests", reason="build", queue=True,
                                            paths=lambda n: kappa.paths("std_a", n))
        kappa.registry.flip_alias("std_a_served", "std_a", expected_version=None, new_version=1, actor="tests",
                                  reason="first")
        yield kappa


def alias_events(outlet_events):
    return outlet_events[assets.FLIPS].asset_alias_events


def announce(k, outlet_events, *, flipped: bool, run_tag: str = TAG):
    return assets.announce_flip(k, outlet_events, action="promote", pipeline="std_a", alias="std_a_served",
                                version=2, previous_version=1, flipped=flipped, run_tag=run_tag,
                                actor="airflow:alice", reason=f"new titles {TAG}", at=123.0)


def test_the_asset_of_an_alias_is_named_in_one_place_and_kept_as_written():
    a = assets.kappa_alias_asset("member_profiles_std")
    assert (a.name, a.uri, a.group) == ("kappa.member_profiles_std", "kappa://alias/member_profiles_std", "asset")
    with pytest.raises(ConfigError, match="invalid alias name 'Member-Profiles'"):
        assets.kappa_alias_asset("Member-Profiles")


def test_a_flip_adds_one_event_to_the_alias_asset_through_the_outlet_alias(k):
    from airflow.sdk.definitions.asset import AssetUniqueKey
    from airflow.sdk.execution_time.context import OutletEventAccessors

    k.registry.flip_alias("std_a_served", "std_a", expected_version=1, new_version=2, actor="airflow:alice",
                          reason=f"new titles {TAG}")
    moved_at = k.registry.get_alias("std_a_served").updated_at
    events = OutletEventAccessors()
    extra = announce(k, events, flipped=True)
    assert extra == {"pipeline": "std_a", "alias": "std_a_served", "action": "promote", "version": 2,
                     "previous_version": 1, "rules_version": "v2", "rules_hash": "b" * 64,
                     "table": str(k.paths("std_a", 2).table), "actor": "airflow:alice",
                     "reason": f"new titles {TAG}", "at": moved_at}
    [event] = alias_events(events)
    assert event.source_alias_name == "kappa.flips"
    assert event.dest_asset_key == AssetUniqueKey(name="kappa.std_a_served", uri="kappa://alias/std_a_served")
    assert event.extra == extra


def test_no_flip_no_event_unless_an_earlier_try_of_this_run_made_it(k):
    from airflow.sdk.execution_time.context import OutletEventAccessors

    # the alias already served v2, moved there by another run: a no-op promote announces nothing
    k.registry.flip_alias("std_a_served", "std_a", expected_version=1, new_version=2, actor="ops",
                          reason="by hand [airflow kappa_promote run manual__0]")
    events = OutletEventAccessors()
    assert announce(k, events, flipped=False) is None and alias_events(events) == []
    # moved there by this very run (a retry after a try that died after its flip): announced now
    k.registry.flip_alias("std_a_served", "std_a", expected_version=2, new_version=1, actor="ops", reason="undo")
    k.registry.flip_alias("std_a_served", "std_a", expected_version=1, new_version=2, actor="airflow:alice",
                          reason=f"new titles {TAG}")
    extra = announce(k, events, flipped=False)
    assert (extra["version"], extra["previous_version"]) == (2, 1)
    assert [e.extra for e in alias_events(events)] == [extra]


def test_without_a_task_context_the_extra_is_still_returned(k):
    k.registry.flip_alias("std_a_served", "std_a", expected_version=1, new_version=2, actor="a", reason=TAG)
    assert announce(k, None, flipped=True)["rules_version"] == "v2"


def test_the_downstream_side_reads_each_flip_once_oldest_first():
    from airflow.sdk.execution_time.comms import AssetEventDagRunReferenceResult
    from airflow.sdk.execution_time.context import TriggeringAssetEventsAccessor

    t0 = datetime(2026, 1, 2, tzinfo=timezone.utc)

    def ref(alias, version, at):
        a = assets.kappa_alias_asset(alias)
        return AssetEventDagRunReferenceResult(
            asset={"name": a.name, "uri": a.uri, "extra": {}}, extra={"alias": alias, "version": version},
            source_task_id="promote", source_dag_id="kappa_promote", source_run_id=f"r{version}",
            source_map_index=-1, source_aliases=[{"name": assets.FLIPS.name}], timestamp=at)

    accessor = TriggeringAssetEventsAccessor.build([ref("b_served", 7, t0 + timedelta(seconds=5)),
                                                    ref("a_served", 3, t0)])
    flips = assets.flip_events(accessor)
    assert [(f["asset"], f["extra"]["version"], f["source_run_id"]) for f in flips] == [
        ("kappa.a_served", 3, "r3"), ("kappa.b_served", 7, "r7")]
    assert assets.flip_events(None) == []


def test_an_automatic_rollback_is_an_event_on_the_alias_asset_and_fails_the_monitor_task_naming_its_cause(
        k, monkeypatch, caplog):
    """kappa_monitor's watch task announces each rollback the watch pass made (and succeeds, so that
    Airflow records the event); its monitor task then fails with pipeline, version and cause."""
    from contextlib import nullcontext

    from airflow.sdk.execution_time.context import OutletEventAccessors

    from orchestrator.airflow import monitor_tasks, tasks
    from orchestrator.core.exceptions import LifecycleError
    from orchestrator.lifecycle import watch as watch_mod

    k.registry.flip_alias("std_a_served", "std_a", expected_version=1, new_version=2, actor="ops", reason="promote")
    cause = "v2: lag 42.0 s over the limit 5 s (watch_max_lag_seconds) for 3 samples in a row"

    def the_watch_rolls_back(kk, spec, *, actor):   # what watch_pass does on the real stack
        kk.registry.flip_alias("std_a_served", "std_a", expected_version=2, new_version=1, actor="kappa-watch",
                               reason=f"automatic rollback: {cause}")
        return [{"kind": "rolled_back", "pipeline": spec.name, "version": 2, "to_version": 1, "cause": cause,
                 "degraded": "stopped"}]

    monkeypatch.setattr(tasks, "task_kappa", lambda: nullcontext(k))
    monkeypatch.setattr(watch_mod, "watch_pass", the_watch_rolls_back)
    events = OutletEventAccessors()
    caplog.set_level("INFO", logger="kappa.airflow")
    [action] = monitor_tasks.watch(user=None, run_id="scheduled__1", outlet_events=events)
    assert [r.getMessage() for r in caplog.records if r.name == "kappa.airflow"] == [   # words, not raw JSON
        "asset event on kappa.std_a_served (kappa://alias/std_a_served): alias std_a_served -> std_a v1 (rollback "
        "from v2 by kappa-watch; rules v1)",
        f"watch std_a v2: degraded ({cause}): rolled back to v1; v2 stopped"]
    caplog.clear()
    [event] = alias_events(events)
    assert event.extra == action["asset_event"]
    assert {key: event.extra[key] for key in ("action", "version", "previous_version", "actor", "reason")} == {
        "action": "rollback", "version": 1, "previous_version": 2, "actor": "kappa-watch",
        "reason": f"automatic rollback: {cause}"}
    with pytest.raises(LifecycleError) as e:
        monitor_tasks.monitor(user=None, run_id="scheduled__1", watched=[action])
    # first the rollback, then what else the pass found (v1's job is not running in this fake world)
    assert str(e.value).startswith(f"std_a v2 was rolled back automatically to v1: {cause}; "), str(e.value)
    said = [r.getMessage() for r in caplog.records if r.name == "kappa.airflow"]   # said before it failed
    assert f"problem: std_a v2 was rolled back automatically to v1: {cause}" in said, said
