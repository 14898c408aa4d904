"""The metrics endpoint: a real registry's rows scraped over HTTP on 127.0.0.1, and OpenTelemetry."""

from __future__ import annotations

import math
import urllib.error
import urllib.request

import threading

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from orchestrator.core.exceptions import ConflictError
from orchestrator.lifecycle.monitor import MonitorReport
from orchestrator.observe.metrics import CONTENT_TYPE, MetricsHub, MetricsServer, parse_text, render_text, Metric

P = "standardize"


@pytest.fixture
def figures(seeded):
    """v1 served then replaced by v2 (two flips, one lost race), v2 lagging 30 s, v1 unknown; restarts."""
    reg = seeded.registry
    for v in (1, 2):
        reg.set_state(P, v, "caught_up")
    alias = seeded.pipeline(P).alias
    reg.flip_alias(alias, P, expected_version=None, new_version=1, actor="alice", reason="first", serve=True)
    reg.flip_alias(alias, P, expected_version=1, new_version=2, actor="alice", reason="v2", serve=True)
    with pytest.raises(ConflictError):
        reg.flip_alias(alias, P, expected_version=1, new_version=2, actor="bob", reason="late", serve=True)
    reg.add_lag_sample(P, 1, 7, {}, at=1000.0, lag_seconds=3.0)
    reg.add_lag_sample(P, 1, None, {}, at=1001.0)                      # newest: unknown
    reg.add_lag_sample(P, 2, 1500, {"member_profiles:0": 1500}, at=1002.0, lag_seconds=30.25)
    for outcome in ("ok", "ok", "gave_up"):
        reg.audit("restart", actor="supervisor", pipeline=P, version=2, outcome=outcome)
    return seeded


@pytest.fixture
def served(figures):
    hub = MetricsHub(lambda: figures)
    server = MetricsServer(hub, "127.0.0.1", 0).start()
    try:
        yield hub, server
    finally:
        server.stop()


def _scrape(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.headers["Content-Type"], resp.read().decode("utf-8")


def test_scrape_serves_the_registry_figures(served):
    hub, server = served
    assert server.host == "127.0.0.1" and server.port > 0
    ctype, text = _scrape(server.url)
    assert ctype == CONTENT_TYPE
    assert "# TYPE kappa_lag_seconds gauge" in text and "# TYPE kappa_flips_total counter" in text
    m = parse_text(text)
    v = {"pipeline": P}
    assert m[("kappa_lag_records", (("pipeline", P), ("version", "2")))] == 1500
    assert m[("kappa_lag_seconds", (("pipeline", P), ("version", "2")))] == 30.25
    assert math.isnan(m[("kappa_lag_records", (("pipeline", P), ("version", "1")))])   # unknown, never 0
    assert math.isnan(m[("kappa_lag_seconds", (("pipeline", P), ("version", "1")))])
    assert m[("kappa_lag_sample_timestamp_seconds", (("pipeline", P), ("version", "2")))] == 1002.0
    assert m[("kappa_serving_version", (("alias", "member_profiles_std"), *v.items()))] == 2
    assert m[("kappa_flips_total", (("outcome", "ok"), *v.items()))] == 2
    assert m[("kappa_flips_total", (("outcome", "conflict"), *v.items()))] == 1
    assert m[("kappa_job_restarts_total", (("outcome", "ok"), *v.items()))] == 2
    assert m[("kappa_job_restarts_total", (("outcome", "gave_up"), *v.items()))] == 1
    assert m[("kappa_version_state", (("pipeline", P), ("state", "serving"), ("version", "2")))] == 1
    assert m[("kappa_version_state", (("pipeline", P), ("state", "standby"), ("version", "1")))] == 1
    assert not any(name == "kappa_ready" for name, _ in m)                  # no monitor pass yet


def test_readiness_and_rejects_after_a_pass(served, figures):
    hub, server = served
    run_dir = figures.paths(P, 2).run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "status.json").write_text('{"state": "running", "rejects": 0, "heartbeat_at": 0}')
    write_deltalake(str(figures.paths(P, 2).rejects), pa.table({"key": [str(i) for i in range(12)]}))
    hub.record_pass(MonitorReport(at=0.0, versions=[
        {"pipeline": P, "version": 2, "readiness": "lagging"}, {"pipeline": P, "version": 1, "readiness": "ready"}]))
    hub.record_pass(None)
    m = parse_text(_scrape(server.url)[1])
    assert m[("kappa_ready", (("pipeline", P), ("version", "1")))] == 1
    assert m[("kappa_ready", (("pipeline", P), ("version", "2")))] == 0
    assert m[("kappa_readiness", (("pipeline", P), ("state", "lagging"), ("version", "2")))] == 1
    assert m[("kappa_readiness", (("pipeline", P), ("state", "ready"), ("version", "2")))] == 0
    assert m[("kappa_rejects", (("pipeline", P), ("version", "2")))] == 12
    assert m[("kappa_monitor_passes_total", (("outcome", "ok"),))] == 1
    assert m[("kappa_monitor_passes_total", (("outcome", "failed"),))] == 1


def test_other_paths_are_404(served):
    with pytest.raises(urllib.error.HTTPError) as e:
        _scrape(served[1].url.replace("/metrics", "/nope"))
    assert e.value.code == 404


def test_text_format_escapes_label_values():
    text = render_text([Metric("kappa_rejects", (("pipeline", 'a"b\\c\nd'),), 3.0)])
    assert 'kappa_rejects{pipeline="a\\"b\\\\c\\nd"} 3' in text
    assert parse_text(text) == {("kappa_rejects", (("pipeline", 'a"b\\c\nd'),)): 3.0}


def test_opentelemetry_observes_the_same_figures(figures):
    pytest.importorskip("opentelemetry.sdk.metrics")
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from orchestrator.observe.otel import start_otel

    reader = InMemoryMetricReader()
    provider = start_otel(MetricsHub(lambda: figures, min_age=60.0), [reader])
    try:
        data = reader.get_metrics_data()
        points = {(m.name, tuple(sorted(p.attributes.items()))): p.value
                  for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                  for p in m.data.data_points}
    finally:
        provider.shutdown()
    assert points[("kappa_lag_seconds", (("pipeline", P), ("version", "2")))] == 30.25
    assert ("kappa_lag_seconds", (("pipeline", P), ("version", "1"))) not in points   # unknown: no point
    assert points[("kappa_flips", (("outcome", "ok"), ("pipeline", P)))] == 2


def test_without_a_reader_or_endpoint_nothing_is_set_up(figures, monkeypatch):
    from orchestrator.observe.otel import start_otel

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert start_otel(MetricsHub(lambda: figures)) is None


def test_metrics_show_prints_the_page(run, figures):
    result = run("metrics", "show")
    assert result.exit_code == 0, result.output
    assert parse_text(result.stdout)[("kappa_lag_seconds", (("pipeline", P), ("version", "2")))] == 30.25


def test_monitor_passes_feed_the_hub(seeded):
    from orchestrator.cli.metrics import run_monitor_passes

    hub, out, err = MetricsHub(lambda: seeded), [], []
    failed = run_monitor_passes(hub, lambda: seeded, actor="metrics-test", interval=0.1, passes=2,
                                stop=threading.Event(), out=out.append, err=err.append, pipelines=[P])
    assert (failed, err) == (0, [])
    m = parse_text(render_text(hub.snapshot()))
    assert m[("kappa_monitor_passes_total", (("outcome", "ok"),))] == 2
    assert m[("kappa_monitor_passes_total", (("outcome", "failed"),))] == 0
    assert m[("kappa_monitor_last_pass_timestamp_seconds", ())] > 0
