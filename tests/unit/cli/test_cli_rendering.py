"""How readiness samples and validation reports are shown when output is not a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from orchestrator.cli.app import error_line
from orchestrator.observe.render import render_report
from orchestrator.observe.progress import LagProgress, fmt_eta


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200, force_terminal=False, highlight=False), buf


def _sample(lag, state="hydrating", eta=None, ok=0):
    return {"pipeline": "standardize", "version": 2, "state": state, "total_lag": lag, "eta_seconds": eta,
            "consecutive_ok": ok, "required_samples": 3, "threshold": 100, "reason": "job running",
            "lag_seconds": 4.0, "catchup_seconds": 30.0}


def test_lag_progress_prints_lines_off_a_terminal():
    console, buf = _console()
    with LagProgress(console) as bars:
        bars.update(_sample(1000))
        bars.update(_sample(None))
        bars.update(_sample(250, eta=3.2))
        bars.update(_sample(50, state="ready", eta=0.0, ok=3))
    lines = buf.getvalue().splitlines()
    assert len(lines) == 4
    assert "lag     1,000 (  0.0% caught up from a peak of 1,000)" in lines[0]
    assert "lag   unknown" in lines[1]
    assert "( 75.0% caught up from a peak of 1,000), ETA 3 s, hydrating (0/3 samples <= 100, <= 30 s old), 4 s behind" in lines[2]
    assert "(100.0% caught up from a peak of 1,000), ETA 0 s, ready (3/3 samples <= 100, <= 30 s old)" in lines[3]


def test_fmt_eta():
    assert [fmt_eta(x) for x in (None, 0.2, 42.4, 600)] == ["-", "0 s", "42 s", "10.0 min"]


def test_error_line_is_one_line():
    assert error_line(ValueError("a\n  b\n\nc")) == "Error: a b c"


def test_render_report():
    from orchestrator.lifecycle.report import Report

    console, buf = _console()
    report = {
        "pipeline": "standardize", "version": 2, "serving_version": 1, "rules_version": "v2",
        "serving_rules_version": "v1", "keys_new": 59_000, "keys_serving": 59_010, "key_delta_ratio": 10 / 59_010,
        "key_count_tolerance": 0.01, "key_count_ok": True, "offsets_read": 300_000, "rejects": 500,
        "reject_rate": 500 / 300_000, "max_reject_rate": 0.01, "reject_rate_ok": True, "rows_compared": 58_990,
        "rows_changed": 12_345, "rows_input_differs": 7, "keys_only_new": 10, "keys_only_serving": 20,
        "changed_by_column": {"title": 12_000, "company": 345},
        "top_changes": {"title": [{"old": "Software Dev", "new": "Software Engineer", "count": 4_000}]},
        "problems": [], "path": "/tmp/report.json"}
    render_report(console, {**report, "keys_compared": Report.model_construct(**report).keys_compared})
    text = buf.getvalue()
    assert "validation report: standardize v2 (rules v2) against serving v1 (rules v1)" in text
    assert "keys: 59,000 keys in v2, 59,010 in v1; all compared: difference 0.02%, tolerance 1.00% ok" in text
    assert "rejects: 500 of 300,000 records read (0.17%, limit 1.00%) ok" in text
    assert "changed by the new rules: 12,345 (title: 12,000, company: 345)" in text
    assert "4,000" in text and "Software Dev" in text and "Software Engineer" in text
    assert "saved to /tmp/report.json" in text


def test_a_report_saved_before_it_carried_its_key_phrase_renders_its_counts():
    console, buf = _console()
    render_report(console, {"pipeline": "standardize", "version": 2, "serving_version": 1, "keys_new": 59_000,
                            "keys_serving": 59_010, "key_delta_ratio": 10 / 59_010, "key_count_tolerance": 0.01,
                            "key_count_ok": True})
    assert "keys: 59,000 keys in v2, 59,010 in v1: difference 0.02%, tolerance 1.00% ok" in buf.getvalue()


def test_json_values_are_strict_json():
    import json
    from datetime import datetime, timezone
    from pathlib import Path

    from pydantic import BaseModel

    from orchestrator.cli.render import to_json

    class R(BaseModel):
        ratio: float
        at: datetime
        path: Path
        pair: tuple[int, int]

    r = R(ratio=float("inf"), at=datetime(2026, 1, 2, tzinfo=timezone.utc), path=Path("/x"), pair=(1, 2))
    expected = {"ratio": "inf", "at": "2026-01-02T00:00:00Z", "path": "/x", "pair": [1, 2]}

    def strict(text: str):
        def refuse(name):
            raise AssertionError(f"not strict JSON: {name}")

        return json.loads(text, parse_constant=refuse)

    assert strict(to_json(r)) == expected
    assert strict(to_json([r, r])) == [expected, expected]
    assert strict(to_json({"r": r, "n": float("-inf"), "title": "Señor"})) == {"r": expected, "n": "-inf",
                                                                                "title": "Señor"}
    assert "Señor" in to_json({"title": "Señor"})


def test_status_shows_read_progress_of_a_running_backfill():
    """The backfill is one micro-batch: while it runs, lag (checkpoint offsets) stays put and the
    job's read progress is what moves."""
    from orchestrator.cli.render import status_table

    version = {"version": 2, "serving": False, "state": "backfilling", "readiness": "hydrating", "lag": 2_000_000,
               "eta_seconds": None, "rejects": 0, "rules_version": "v2",
               "job": {"health": "running", "pid": 4242,
                       "reading": {"batch_id": 0, "records_read": 750_000, "records_total": 2_000_000}}}
    console, out = _console()
    console.print(status_table([{"pipeline": "standardize", "versions": [version]}]))
    assert "running (pid 4242), reading micro-batch 0: 750,000 of 2,000,000 records" in out.getvalue()


def test_a_time_cell_is_kappa_s_one_utc_clock_whatever_form_the_time_comes_in():
    from datetime import datetime, timedelta, timezone

    from orchestrator.core.times import utc_clock
    from orchestrator.observe.render import fmt_time

    at = 1_746_101_101.0                                  # 2025-05-01 12:05:01 UTC
    assert fmt_time(at) == utc_clock(at) == "2025-05-01 12:05:01 UTC"
    assert fmt_time(datetime(2025, 5, 1, 12, 5, 1)) == "2025-05-01 12:05:01 UTC"            # naive: UTC
    assert fmt_time(datetime(2025, 5, 1, 14, 5, 1, tzinfo=timezone(timedelta(hours=2)))) == "2025-05-01 12:05:01 UTC"
    assert fmt_time("2025-05-01T12:05:01+00:00") == "2025-05-01 12:05:01 UTC"
    assert (fmt_time(None), fmt_time("not a time")) == ("-", "not a time")
