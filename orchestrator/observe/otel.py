"""The same figures through OpenTelemetry's metrics API, when `opentelemetry-sdk` is installed.

It comes with Apache Airflow, so it is there wherever the Airflow extra is. One observable
instrument per metric family of `orchestrator.observe.metrics` (gauges, and observable counters
for the `_total` families) on a MeterProvider of kappa's own (the global one is left alone), all
fed from one `MetricsHub` snapshot per collection. An OTLP exporter is attached only when
`OTEL_EXPORTER_OTLP_ENDPOINT` is set (OTLP over HTTP, the SDK's standard variables apply);
otherwise nothing leaves the process unless a caller passes its own readers (tests do). Unknown
lag is no observation, never 0.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from typing import Any, Sequence

from orchestrator.observe.metrics import FAMILIES, MetricsHub

__all__ = ["available", "start_otel"]

log = logging.getLogger(__name__)


def available() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry.sdk.metrics") is not None
    except ImportError:  # the opentelemetry namespace without the SDK
        return False


def start_otel(hub: MetricsHub, readers: Sequence[Any] = (), *, export_interval_seconds: float = 60.0) -> Any | None:
    """A MeterProvider observing `hub`'s figures; None when the SDK is missing or nothing would read it.

    Call `.shutdown()` on the result when done (it flushes the exporter).
    """
    if not available():
        return None
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    readers = list(readers)
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(),
                                                         export_interval_millis=export_interval_seconds * 1000))
        except ImportError:
            log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but opentelemetry-exporter-otlp-proto-http is not "
                        "installed; install it to export kappa's metrics over OTLP")
    if not readers:
        return None
    provider = MeterProvider(metric_readers=readers, resource=Resource.create({"service.name": "kappa"}))
    meter = provider.get_meter("kappa")

    def observe(name: str):
        def callback(options: CallbackOptions):
            try:
                metrics = hub.snapshot()
            except Exception as e:  # noqa: BLE001 - a failed read is no observation, not a crash
                log.warning("cannot read kappa's figures for OpenTelemetry: %s", e)
                return []
            return [Observation(m.value, dict(m.labels)) for m in metrics
                    if m.name == name and not math.isnan(m.value)]
        return callback

    for name, (kind, help_text) in FAMILIES.items():
        otel_name = name.removesuffix("_total") if kind == "counter" else name
        make = meter.create_observable_counter if kind == "counter" else meter.create_observable_gauge
        make(otel_name, callbacks=[observe(name)], description=help_text)
    return provider
