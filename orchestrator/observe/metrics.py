"""Metrics: kappa's figures in the Prometheus text format, over HTTP, and through OpenTelemetry.

The figures come from the registry (so they are the same whichever process took them) and from
the latest monitor pass of the serving process (readiness is a decision, not a stored row):

| metric                              | type    | labels                      | from                          |
|-------------------------------------|---------|-----------------------------|-------------------------------|
| `kappa_lag_records`                 | gauge   | pipeline, version           | newest lag sample (NaN: unknown) |
| `kappa_lag_seconds`                 | gauge   | pipeline, version           | newest lag sample (NaN: unknown) |
| `kappa_lag_sample_timestamp_seconds`| gauge   | pipeline, version           | when that sample was taken    |
| `kappa_version_state`               | gauge   | pipeline, version, state    | registry (1 for the current state) |
| `kappa_readiness`                   | gauge   | pipeline, version, state    | latest monitor pass (1: current) |
| `kappa_ready`                       | gauge   | pipeline, version           | latest monitor pass (1 ready, 0 not) |
| `kappa_serving_version`             | gauge   | pipeline, alias             | registry alias                |
| `kappa_rejects`                     | gauge   | pipeline, version           | rows of the rejects table (as `kappa status`) |
| `kappa_flips_total`                 | counter | pipeline, outcome           | audit log, action flip_alias  |
| `kappa_job_restarts_total`          | counter | pipeline, outcome           | audit log, action restart     |
| `kappa_watch_state`                 | gauge   | pipeline, version, state    | the version's watch (1: current) |
| `kappa_watch_samples`               | gauge   | pipeline, version           | samples the watch has taken   |
| `kappa_watch_decisions_total`       | counter | pipeline, outcome           | audit log, action watch       |
| `kappa_monitor_passes_total`        | counter | outcome                     | this process's passes         |
| `kappa_monitor_last_pass_timestamp_seconds` | gauge | -                    | this process's passes         |

Unknown lag is NaN in the text format (never 0) and no observation in OpenTelemetry. Retired
versions are left out. `MetricsServer` serves `GET /metrics` (and `/`) on 127.0.0.1 by default;
every scrape reads the registry afresh.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable

from orchestrator.core.states import VersionState

__all__ = ["FAMILIES", "Metric", "MetricsHub", "MetricsServer", "collect", "render_text", "parse_text",
           "CONTENT_TYPE"]

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: name -> (type, help)
FAMILIES: dict[str, tuple[str, str]] = {
    "kappa_lag_records": ("gauge", "Total lag of a version in records at its newest lag sample (NaN: unknown)."),
    "kappa_lag_seconds": ("gauge", "Age in seconds of the oldest record a version has not processed (NaN: unknown)."),
    "kappa_lag_sample_timestamp_seconds": ("gauge", "Unix time of the version's newest lag sample."),
    "kappa_version_state": ("gauge", "The version's registry state (1 for the current one)."),
    "kappa_readiness": ("gauge", "The version's readiness at the latest monitor pass (1 for the current one)."),
    "kappa_ready": ("gauge", "1 if the version was ready at the latest monitor pass, else 0."),
    "kappa_serving_version": ("gauge", "The version the pipeline's serving alias points at."),
    "kappa_rejects": ("gauge", "Rows in the version's rejects table."),
    "kappa_flips_total": ("counter", "Serving alias flips recorded in the audit log, by outcome."),
    "kappa_job_restarts_total": ("counter", "Supervisor restarts of jobs recorded in the audit log, by outcome."),
    "kappa_watch_state": ("gauge", "The state of a promoted version's watch (1 for the current one)."),
    "kappa_watch_samples": ("gauge", "Samples the watch of a promoted version has taken."),
    "kappa_watch_decisions_total": ("counter", "Watch decisions recorded in the audit log (rolling_back, "
                                               "rolled_back, passed, ended), by outcome."),
    "kappa_monitor_passes_total": ("counter", "Monitor passes this process ran, by outcome."),
    "kappa_monitor_last_pass_timestamp_seconds": ("gauge", "Unix time this process's latest monitor pass ended."),
}

READINESS_STATES = ("hydrating", "lagging", "ready", "failing")


@dataclass(frozen=True)
class Metric:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass
class PassState:
    """What the monitor passes of this process learnt: readiness per version, pass counts."""

    readiness: dict[tuple[str, int], str] = field(default_factory=dict)
    passes_ok: int = 0
    passes_failed: int = 0
    last_pass_at: float | None = None

    def record(self, report: Any | None, *, at: float | None = None) -> None:
        """Take in one pass: its MonitorReport, or None for a pass that failed."""
        self.last_pass_at = time.time() if at is None else at
        if report is None:
            self.passes_failed += 1
            return
        self.passes_ok += 1
        self.readiness = {(v["pipeline"], int(v["version"])): v["readiness"] for v in report.versions}


#: The states of a watch (`orchestrator.lifecycle.watch`; stored by `Registry.update_watch`).
WATCH_STATES = ("watching", "rolling_back", "rolled_back", "passed", "ended")


def _m(name: str, value: float | None, **labels: Any) -> Metric:
    return Metric(name, tuple((k, str(v)) for k, v in labels.items()), math.nan if value is None else float(value))


def collect(k: Any, passes: PassState | None = None, pipelines: Iterable[str] | None = None) -> list[Metric]:
    """Every figure now, from the registry, the jobs' status files and `passes`."""
    from orchestrator.jobctl.health import rejects_of

    specs = k.specs(pipelines)
    names = [spec.name for spec in specs]
    reg = k.registry
    out: list[Metric] = []
    newest = reg.latest_lag_samples(names)
    passes = passes or PassState()
    for spec in specs:
        name = spec.name
        alias = reg.get_alias(spec.alias)
        if alias is not None and alias.pipeline == name:
            out.append(_m("kappa_serving_version", alias.version, pipeline=name, alias=spec.alias))
        for v in sorted(k.versions(spec), key=lambda v: v.version):
            rec = v.record
            if rec.state == VersionState.RETIRED:
                continue
            n = rec.version
            out.append(_m("kappa_version_state", 1, pipeline=name, version=n, state=str(rec.state)))
            sample = newest.get((name, n))
            if sample is not None:
                out.append(_m("kappa_lag_records", sample.total, pipeline=name, version=n))
                out.append(_m("kappa_lag_seconds", sample.lag_seconds, pipeline=name, version=n))
                out.append(_m("kappa_lag_sample_timestamp_seconds", sample.at, pipeline=name, version=n))
            ready = passes.readiness.get((name, n))
            if ready is not None:
                out.extend(_m("kappa_readiness", int(s == ready), pipeline=name, version=n, state=s)
                           for s in READINESS_STATES)
                out.append(_m("kappa_ready", int(ready == "ready"), pipeline=name, version=n))
            watch = (rec.details or {}).get("watch")
            if isinstance(watch, dict):
                out.extend(_m("kappa_watch_state", int(s == watch.get("state")), pipeline=name, version=n, state=s)
                           for s in WATCH_STATES)
                out.append(_m("kappa_watch_samples", watch.get("samples", 0), pipeline=name, version=n))
            rejects, _ = rejects_of(v)
            if rejects is not None:
                out.append(_m("kappa_rejects", rejects, pipeline=name, version=n))
    family = {"flip_alias": "kappa_flips_total", "restart": "kappa_job_restarts_total",
              "watch": "kappa_watch_decisions_total"}
    for (action, outcome, pipeline), count in sorted(reg.audit_counts(family).items(), key=str):
        if pipeline in names:
            out.append(_m(family[action], count, pipeline=pipeline, outcome=outcome))
    out.append(_m("kappa_monitor_passes_total", passes.passes_ok, outcome="ok"))
    out.append(_m("kappa_monitor_passes_total", passes.passes_failed, outcome="failed"))
    if passes.last_pass_at is not None:
        out.append(_m("kappa_monitor_last_pass_timestamp_seconds", passes.last_pass_at))
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return str(int(v)) if v.is_integer() and abs(v) < 1 << 53 else repr(v)


def render_text(metrics: Iterable[Metric]) -> str:
    """The Prometheus text exposition format (0.0.4): HELP and TYPE once per family, then its samples."""
    by_family: dict[str, list[Metric]] = {}
    for m in metrics:
        by_family.setdefault(m.name, []).append(m)
    lines: list[str] = []
    for name, (kind, help_text) in FAMILIES.items():
        if name not in by_family:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for m in by_family[name]:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in m.labels)
            lines.append(f"{name}{{{labels}}} {_number(m.value)}" if labels else f"{name} {_number(m.value)}")
    return "\n".join(lines) + "\n"


def parse_text(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(name, sorted labels): value} of a text-format page; enough for tests and `kappa metrics show`."""
    import re

    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
    label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = sample.match(line)
        if m is None:
            raise ValueError(f"not a text-format sample line: {line!r}")
        labels = tuple(sorted((k, v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\"))
                              for k, v in label.findall(m.group(2) or "")))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


class MetricsHub:
    """The figures of one process: `snapshot()` reads them (at most every `min_age` seconds), thread-safe."""

    def __init__(self, k_of: Callable[[], Any], pipelines: Iterable[str] | None = None, *, min_age: float = 0.0):
        self.k_of, self.pipelines = k_of, list(pipelines) if pipelines else None
        self.passes = PassState()
        self.min_age = min_age
        self._lock = threading.Lock()
        self._latest: tuple[float, list[Metric]] | None = None

    def record_pass(self, report: Any | None) -> None:
        with self._lock:
            self.passes.record(report)
            self._latest = None

    def snapshot(self) -> list[Metric]:
        with self._lock:
            now = time.monotonic()
            if self._latest is None or now - self._latest[0] > self.min_age:
                self._latest = (now, collect(self.k_of(), self.passes, self.pipelines))
            return self._latest[1]


class _Handler(BaseHTTPRequestHandler):
    hub: MetricsHub

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.split("?")[0] not in ("/", "/metrics"):
            self.send_error(404, "kappa serves its metrics at /metrics")
            return
        try:
            body, status = render_text(self.hub.snapshot()).encode("utf-8"), 200
        except Exception as e:  # noqa: BLE001 - a scrape reports the error, the server keeps serving
            log.warning("metrics scrape failed: %s", e)
            body, status = f"# kappa cannot read its figures: {' '.join(str(e).split())}\n".encode(), 503
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("metrics %s", fmt % args)


class MetricsServer:
    """`GET /metrics` on host:port (port 0: a free one, see `.port`), in a daemon thread."""

    def __init__(self, hub: MetricsHub, host: str = "127.0.0.1", port: int = 9464):
        handler = type("KappaMetricsHandler", (_Handler,), {"hub": hub})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.host, self.port = host, self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="kappa-metrics", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
