"""The seed pipelines as declared in deploy/pipelines.toml, run by the control plane: deployed
(`lifecycle.deploy` spawns the Spark job), awaited until caught up, promoted, and read through
their alias's pointer file like any reader would. The served table equals, schema and rows, the
table computed in the test from the records produced (plain json, `seedjob_helpers`), and the
version's rejects table holds exactly the malformed record with its full reason.

profile_settings_join is the join keyed by one column (a table-table join that deletes rows);
ad_click_join (a stream-stream join) and pageviews_hourly (a windowed aggregation) are the
declared pipelines with composite keys. Only the topics and the alias are replaced (fresh names
on the session broker); every other field is the declared one.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from orchestrator.context import Kappa
from orchestrator.core.pipelines import load_pipelines
from orchestrator.core.settings import Settings
from orchestrator.dev import seedgen
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote
from orchestrator.serving import open_alias
from seedjob_helpers import expected_joined, expected_pairs, ts
from orchestrator.core.tables import read_table
from tests.teardown import kill_jobs

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
DECLARED = load_pipelines(REPO / "deploy" / "pipelines.toml")
DEADLINE = float(os.environ.get("KAPPA_TEST_READY_DEADLINE", "900"))
START = datetime(2024, 5, 1, 8, 0, tzinfo=timezone.utc)
UTC_US = pa.timestamp("us", tz="UTC")
#: ad_click_join's join bound when the pipeline sets no `bound` option (the job's documented default).
BOUND = timedelta(minutes=10)


@dataclass
class Served:
    k: Kappa
    pipeline: str
    version: int
    warnings: tuple
    promoted: object      # PromoteResult
    table: pa.Table       # read through the alias pointer
    rejects: list[tuple]  # (topic, partition, offset, error) of the version's rejects table


@pytest.fixture
def control_plane(bootstrap, tmp_path):
    """deploy -> wait ready -> promote one declared pipeline on fresh topics; its jobs stopped after."""
    made: list[tuple[Kappa, str]] = []

    def serve(pipeline: str, topics: tuple[str, ...], *, force: bool = False) -> Served:
        declared = DECLARED[pipeline]
        assert len(topics) == len(declared.topics)
        spec = declared.model_copy(update={"topics": topics, "alias": f"{declared.alias}_{uuid.uuid4().hex[:8]}"})
        settings = Settings(home=tmp_path / pipeline, bootstrap_servers=bootstrap,
                            group_prefix=f"kt-{uuid.uuid4().hex[:8]}")
        k = Kappa(settings, pipelines={pipeline: spec})
        made.append((k, pipeline))
        info = deploy(k, k.pipeline(pipeline), actor="tests", reason="seed pipeline through the control plane", force=force)
        wait_ready(k.version(pipeline, info.version), deadline_seconds=DEADLINE, poll_seconds=1)
        promoted = promote(k.version(pipeline, info.version), actor="tests", reason="serve it")
        assert promoted.flipped and k.registry.get_alias(spec.alias).version == info.version
        rejects = read_table(k.paths(pipeline, info.version).rejects).to_pylist()
        return Served(k, pipeline, info.version, tuple(info.warnings), promoted,
                      read_table(open_alias(spec.alias, settings)),
                      sorted((r["topic"], r["partition"], r["offset"], r["error"]) for r in rejects))

    try:
        yield serve
    finally:
        for k, pipeline in made:
            kill_jobs(k, [pipeline])
            k.close()


def forced_warning(topic: str, pipeline: str) -> str:
    return (f"source topic {topic!r} of pipeline {pipeline!r} has no cleanup.policy (the broker default, delete): "
            f"the broker deletes old records of such a topic, so reading it from offset zero cannot rebuild the "
            f"whole table (forced)")


def assert_report(served: Served, rows: int, produced: list) -> None:
    report = served.promoted.report
    assert (report.keys_new, report.offsets_read, report.rejects) == (rows, len(produced), 1)


def test_profile_settings_join_served_through_its_alias(control_plane, bootstrap, seed):
    unique = uuid.uuid4().hex[:8]
    profiles_topic, settings_topic = f"cp_profiles_{unique}", f"cp_settings_{unique}"
    seedgen.create_topics(bootstrap, {profiles_topic: 2, settings_topic: 2},
                          compacted=[profiles_topic, settings_topic])
    members = seedgen.member_ids(30)
    profiles = seedgen.member_profiles(profiles_topic, members, START, updates=40, deletes=3, seed=seed)
    settings = seedgen.member_settings(settings_topic, members[:24], START, updates=30, deletes=2, seed=seed + 1)
    later = seedgen.to_ms(START + timedelta(hours=3))
    deleted = next(r.key for r in profiles if r.value is None)
    edge = [
        seedgen.SeedRecord(settings_topic, b"m0000500", b'{"language": "en"}', later),            # no profile
        seedgen.SeedRecord(profiles_topic, deleted, b'{"name": "Back Again", "zip": "10115"}', later + 1),
    ]
    bad = seedgen.SeedRecord(settings_topic, members[1].encode(), b'{"visibility": "everyone"}', later + 2)
    produced = seedgen.produce(bootstrap, seedgen.by_time(profiles, settings) + edge + [bad])

    served = control_plane("profile_settings_join", (profiles_topic, settings_topic))

    expected = expected_joined([r for r in produced if r.topic == profiles_topic],
                               [r for r in produced if r.topic == settings_topic])
    assert "m0000500" not in expected and expected[deleted.decode()]["name"] == "Back Again"
    assert served.table.schema == pa.schema([
        ("member_id", pa.string()), ("name", pa.string()), ("title", pa.string()), ("company", pa.string()),
        ("location", pa.string()), ("zip", pa.string()), ("language", pa.string()),
        ("email_notifications", pa.bool_()), ("visibility", pa.string()),
        ("profile_offset", pa.int64()), ("settings_offset", pa.int64())])
    rows = served.table.to_pylist()
    assert len(rows) == len(expected)
    assert {r["member_id"]: r for r in rows} == expected
    (reject,) = [r for r in produced if r.value == bad.value]
    assert served.rejects == [(settings_topic, reject.partition, reject.offset,
                               "field 'visibility' is 'everyone', expected one of public, connections, private")]
    assert served.warnings == ()
    assert_report(served, len(expected), produced)


def test_ad_click_join_composite_key_served_through_its_alias(control_plane, bootstrap, seed):
    unique = uuid.uuid4().hex[:8]
    imp_topic, clk_topic = f"cp_impressions_{unique}", f"cp_clicks_{unique}"
    seedgen.create_topics(bootstrap, {imp_topic: 2, clk_topic: 2})
    imps, clicks = seedgen.ad_events(imp_topic, clk_topic, seedgen.member_ids(8), 120, START, click_rate=0.5,
                                     late_rate=0.1, seed=seed)
    # a second click on one impression: two rows share the impression id, the composite key tells them apart
    first = json.loads(clicks[0].value)
    again = seedgen.SeedRecord(clk_topic, clicks[0].key, json.dumps(
        {**first, "click_id": first["click_id"] + "-again"}).encode(), clicks[0].timestamp_ms + 1000)
    bad = seedgen.SeedRecord(imp_topic, b"imp-bad", json.dumps(
        {"impression_id": "imp-bad", "member_id": "m0000001", "shown_at": seedgen.iso(START)}).encode(),
        seedgen.to_ms(START))
    produced = seedgen.produce(bootstrap, seedgen.by_time(imps, clicks, [again, bad]))

    served = control_plane("ad_click_join", (imp_topic, clk_topic), force=True)

    assert DECLARED["ad_click_join"].key_columns == ("impression_id", "click_id")
    imp_docs = {json.loads(r.value)["impression_id"]: json.loads(r.value) for r in produced if r.topic == imp_topic}
    clk_docs = {json.loads(r.value)["click_id"]: json.loads(r.value) for r in produced if r.topic == clk_topic}
    pairs = expected_pairs([r for r in produced if r.topic == imp_topic],
                           [r for r in produced if r.topic == clk_topic], BOUND)
    assert (first["impression_id"], first["click_id"] + "-again") in pairs
    assert len(pairs) < len(clk_docs)  # the late clicks fall outside the bound
    expected = {(i, c): {"impression_id": i, "ad_id": imp_docs[i]["ad_id"], "member_id": imp_docs[i]["member_id"],
                         "shown_at": ts(imp_docs[i]["shown_at"]), "click_id": c,
                         "clicked_at": ts(clk_docs[c]["clicked_at"])} for i, c in pairs}
    assert served.table.schema == pa.schema([
        ("impression_id", pa.string()), ("ad_id", pa.string()), ("member_id", pa.string()), ("shown_at", UTC_US),
        ("click_id", pa.string()), ("clicked_at", UTC_US)])
    rows = served.table.to_pylist()
    assert len(rows) == len(expected)
    assert {(r["impression_id"], r["click_id"]): r for r in rows} == expected
    (reject,) = [r for r in produced if r.value == bad.value]
    assert served.rejects == [(imp_topic, reject.partition, reject.offset, "field 'ad_id' is missing")]
    assert sorted(served.warnings) == sorted([forced_warning(t, "ad_click_join") for t in (imp_topic, clk_topic)])
    assert_report(served, len(expected), produced)
