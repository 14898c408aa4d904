"""What `kappa up` tells a new user: which pipelines the trigger form offers, and the walk-through."""

from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from orchestrator.airflow.stack import kappa_env
from orchestrator.context import Kappa
from orchestrator.core.pipelines import load_pipelines
from orchestrator.core.resources import default_pipelines_file
from orchestrator.core.settings import Settings
from orchestrator.dev import up_data
from orchestrator.dev.seedgen import DEMO_TOPICS
from orchestrator.dev.up import Up, UpOptions, walk_through

OWN_PIPELINE = '''
[pipelines.clicks]
description = "A team's own pipeline, reading a topic kappa up does not fill."
job = "standardize"
topics = ["clickstream"]
key = "member_id"
alias = "clicks_live"

[pipelines.clicks.options]
backfill = "one-batch"
'''


def _records(filled: dict[str, int]):
    """A stub of the offsets lookup: records per topic, None for a topic that does not exist."""
    def lookup(k, topics):
        return {t: filled.get(t) for t in topics}
    return lookup


def _up(tmp_path, pipelines_file: Path) -> Up:
    up = Up(UpOptions(), Console(file=io.StringIO(), width=400))
    up.k = Kappa(Settings(home=tmp_path / "home", bootstrap_servers="127.0.0.1:9", pipelines_file=pipelines_file))
    up.home = tmp_path / "home"
    up.home.mkdir()
    return up


def test_kappa_up_fills_the_topic_of_every_pipeline_it_offers():
    declared = {t for spec in load_pipelines(default_pipelines_file()).values() for t in spec.topics}
    assert declared == {"member_profiles", *DEMO_TOPICS.values()}


def test_pipelines_without_data_names_each_missing_or_empty_topic(tmp_path):
    k = Kappa(Settings(home=tmp_path / "home", bootstrap_servers="127.0.0.1:9"))
    lookup = _records({"member_profiles": 20_000, "page_views": 5_000, "member_settings": 0})
    assert up_data.pipelines_without_data(k, lookup) == {
        "profile_settings_join": ["topic 'member_settings' is empty"],
        "ad_click_join": ["topic 'ad_impressions' does not exist", "topic 'ad_clicks' does not exist"],
    }
    everything = _records({t: 1 for t in ("member_profiles", *DEMO_TOPICS.values())})
    assert up_data.pipelines_without_data(k, everything) == {}


def test_airflow_gets_a_pipelines_file_without_the_pipelines_that_have_no_data(tmp_path, monkeypatch):
    own = tmp_path / "pipelines.toml"
    own.write_text(default_pipelines_file().read_text() + OWN_PIPELINE)
    up = _up(tmp_path, own)
    monkeypatch.setattr(up_data, "topic_records",
                        _records({t: 10 for t in ("member_profiles", *DEMO_TOPICS.values())}))

    settings = up.offered_settings()

    offered = up.home / "pipelines.up.toml"
    assert settings.pipelines_file == offered
    assert kappa_env(settings)["KAPPA_PIPELINES"] == str(offered)
    assert list(load_pipelines(offered)) == [n for n in load_pipelines(own) if n != "clicks"]
    assert load_pipelines(offered) == {n: s for n, s in load_pipelines(own).items() if n != "clicks"}
    said = up.c.file.getvalue()
    assert "left out of the trigger form, no data: clicks (topic 'clickstream' does not exist)" in said
    assert own.read_text().endswith(OWN_PIPELINE)          # the file given is not changed


def test_with_every_topic_filled_airflow_reads_the_pipelines_file_as_given(tmp_path, monkeypatch):
    up = _up(tmp_path, default_pipelines_file())
    monkeypatch.setattr(up_data, "topic_records",
                        _records({t: 10 for t in ("member_profiles", *DEMO_TOPICS.values())}))
    assert up.offered_settings() is up.k.settings
    assert not (up.home / "pipelines.up.toml").exists()


@pytest.mark.parametrize("grace", [300.0, 0.0])
def test_the_walk_through_says_what_a_rollback_costs_and_where_a_promote_run_ends(grace):
    up = Up(UpOptions(), Console(file=io.StringIO(), width=400))
    up.stack = SimpleNamespace(url="http://127.0.0.1:8080", username="admin")
    spec = SimpleNamespace(grace_period_seconds=grace, alias="member_profiles_std")
    up.k = SimpleNamespace(pipeline=lambda name: spec, registry=SimpleNamespace(
        get_alias=lambda alias: SimpleNamespace(version=1),
        get_version=lambda pipeline, version: SimpleNamespace(rules_version="v1")))
    up.alias, up.home = "member_profiles_std", Path("/tmp/kappa-home")
    up.show_ready()
    said = " ".join(up.c.file.getvalue().split())
    assert "at once" not in said
    assert "restarts from its checkpoint, about 30 s here, and the run's note shows its progress" in said
    assert "promote task ends skipped and the run's note links to kappa_promote" in said
    if grace:
        assert "instant while v1 is a standby (the grace period after a promote, 5 min by default)" in said
        assert re.search(r"ends its run at the flip: v2 serves, and v1 stays a running standby .*"
                         r"then kappa_monitor stops it", said)
    else:
        assert "v1 is stopped at the flip" in said and "instant" not in said
    assert walk_through("standardize", grace)[-1] in up.c.file.getvalue()


def test_the_subset_keeps_the_other_pipelines_tables_as_they_are(tmp_path):
    src = default_pipelines_file()
    keep = ["standardize", "pageviews_hourly", "pageview_enrich"]
    out = up_data.write_pipelines_subset(src, tmp_path / "subset.toml", keep)
    assert load_pipelines(out) == {n: s for n, s in load_pipelines(src).items() if n in keep}


def test_a_file_the_line_wise_cut_cannot_follow_is_not_written(tmp_path):
    src = tmp_path / "inline.toml"
    src.write_text('[pipelines]\na = {job = "standardize", topics = ["x"], key = "k", alias = "a_live"}\n'
                   'b = {job = "standardize", topics = ["y"], key = "k", alias = "b_live"}\n')
    assert up_data.write_pipelines_subset(src, tmp_path / "subset.toml", ["a"]) is None
    assert not (tmp_path / "subset.toml").exists()
