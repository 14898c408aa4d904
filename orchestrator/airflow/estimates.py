"""The backfill estimate in Airflow: in kappa_reprocess's trigger form, and on its run's note.

The form's estimates are made when the dag-processor parses the DAG file, so they are quick and bounded:
one `Kappa` for every pipeline, the log offsets only (no bytes: the JVM tool and a sample are for
`kappa deploy --dry-run`), and one budget of seconds for all of them. A broker that does not answer
makes every later estimate of the pass "unknown" with that reason at once, rather than waiting again.
A registry that does not exist yet is not created (the rate is then the default). The run's note shows
the estimate the deploy stored at `start_version`, and after `wait_ready` the estimate beside the actual.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Mapping

from orchestrator.observe.estimate import BackfillEstimate, compare_text, estimate_backfill

if TYPE_CHECKING:
    from orchestrator.core.pipelines import PipelineSpec
    from orchestrator.core.settings import Settings

__all__ = ["FORM_BUDGET_SECONDS", "form_estimates", "form_label", "start_note", "note_start", "backfill_md"]

log = logging.getLogger("kappa.airflow")

#: Seconds all the form's estimates may take together, at each parse of the DAG file.
FORM_BUDGET_SECONDS = 6.0


def form_label(name: str, est: BackfillEstimate | None, reason: str | None = None) -> str:
    """A pipeline's dropdown label: 'standardize: backfill ~45 s (2,000,000 records, 2 cores; measured on v3)'."""
    if est is None or not est.known:
        return f"{name}: backfill estimate unknown ({reason or (est.reason if est else 'not made')})"
    basis = f"measured on v{est.from_version}" if est.from_version else "default rate, no earlier version measured"
    cores = f"{est.cores} cores" if est.cores else "cluster cores"
    from orchestrator.observe.lag import fmt_seconds

    return f"{name}: backfill ~{fmt_seconds(est.seconds)} ({est.records:,} records at most, {cores}; {basis})"


def form_estimates(settings: Settings, specs: Mapping[str, PipelineSpec],
                   budget: float = FORM_BUDGET_SECONDS) -> dict[str, str]:
    """{pipeline: its dropdown label with the backfill estimate}, all within `budget` seconds. Never raises."""
    from orchestrator.context import Kappa
    from orchestrator.core.exceptions import KappaError
    from orchestrator.serving import registry_file_missing

    deadline = time.monotonic() + budget
    labels: dict[str, str] = {}
    down: str | None = None
    try:
        k = Kappa(settings, pipelines=dict(specs))
        no_registry = registry_file_missing(settings)
    except Exception as e:  # noqa: BLE001 -- the form must render whatever is wrong
        return {name: form_label(name, None, f"kappa's settings: {e}") for name in specs}
    try:
        for name, spec in specs.items():
            left = deadline - time.monotonic()
            if down is not None or left < 0.5:
                labels[name] = form_label(name, None, down or f"no time left of the form's {budget:.0f} s")
                continue
            try:
                history = [] if no_registry else k.registry.list_versions(name)
            except KappaError as e:
                history = []
                log.warning("the form's estimate of %s uses no history: %s", name, e)
            est = estimate_backfill(k, spec, bytes_mode="none", timeout=min(left, 3.0), history=history)
            if not est.known:
                down = est.reason
            labels[name] = form_label(name, est)
    finally:
        k.close()
    return labels


def start_note(pipeline: str, version: int, est: BackfillEstimate | None) -> tuple[str, list[str]]:
    """The run's note when the version starts: (head, body) with its stored estimate."""
    if est is None:
        return f"{pipeline} v{version} started: backfilling from offset zero", []
    return f"{pipeline} v{version} started: {est.summary()}", est.lines()[1:]


def note_start(pipeline: str, version: int, est: BackfillEstimate | None) -> str:
    """Set the run's note when the version starts (`start_note`); returns it."""
    from orchestrator.airflow import notes

    return notes.set_run_note(*start_note(pipeline, version, est))


def backfill_md(details: Mapping[str, Any] | None) -> list[str]:
    """A note's line with the backfill's estimate beside its actual (nothing for a version without an estimate)."""
    text = compare_text(dict(details or {}))
    return [text[0].upper() + text[1:] + ".", ""] if text else []

