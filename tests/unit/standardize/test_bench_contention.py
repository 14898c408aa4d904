"""`kappa bench contention`: its pure parts (windows, ratios against the goals, printed lines) and its
refusals of bad arguments (one line, exit 1, before anything starts). No services."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from orchestrator.dev.contentionbench import (ALONE, OFF, ON, Window, contention_figures, contention_lines,
                                              window_figures)
from orchestrator.dev.freshbench import Probes


def test_probes_are_attributed_to_the_window_they_were_sent_in():
    p = Probes()
    p.sent("m1", "a", at=1.0)
    p.sent("m2", "b", at=5.0)
    p.sent("m3", "c", at=9.0)
    p.seen({"m1": "a", "m2": "b", "m3": "c"}, at=10.0)
    assert p.sent_between(0.0, 5.0) == [9.0]                  # sent at 1, read at 10
    assert sorted(p.sent_between(5.0, 10.0)) == [1.0, 5.0]    # sent at 5 and at 9
    assert p.sent_between(10.0, 20.0) == []


def _windows():
    alone = window_figures(Window(ALONE, 0.0, 30.0, serving_cpu_seconds=12.5), [1.0, 1.2, 1.4, 2.0])
    off = window_figures(Window(OFF, 40.0, 130.0, backfill_seconds=90.0, ready_seconds=101.0, version=2, serving_cpu_seconds=20.0,
                                backfill_cpu_seconds=80.0,
                                estimate={"estimate_seconds": 80.0, "actual_seconds": 90.0, "ratio": 1.125,
                                          "within_goal": True, "rate_source": "measured on v1"}),
                         [2.0, 5.0, 9.0, 12.0])
    on = window_figures(Window(ON, 150.0, 230.0, backfill_seconds=80.0, version=3, backfill_cpu_seconds=70.0,
                               share_changes=[{"to": 0.5}, {"to": 0.25}, {"to": 0.5}]), [1.0, 1.5, 2.5, 3.0])
    return {w["name"]: w for w in (alone, off, on)}


def test_the_ratios_are_p99_over_alone_and_speed_over_alone():
    w = _windows()
    assert (w[ALONE]["p50_seconds"], w[ALONE]["p99_seconds"]) == (1.3, 1.982)
    f = contention_figures(w, backfill_alone=60.0)
    assert f["p99_ratio"] == {OFF: round(11.91 / 1.982, 2), ON: round(2.985 / 1.982, 2)}
    assert f["speed_ratio"] == {OFF: round(60 / 90, 2), ON: 0.75}
    assert f["goals_met"] == {"p99_at_most_2x": True, "backfill_at_least_half_speed": True}
    slow = dict(w, **{ON: dict(w[ON], backfill_seconds=200.0, p99_seconds=5.0)})
    assert contention_figures(slow, backfill_alone=60.0)["goals_met"] == {"p99_at_most_2x": False,
                                                                          "backfill_at_least_half_speed": False}


def test_unmeasured_figures_stay_unknown_and_are_not_counted_as_met():
    w = _windows()
    w[ON] = dict(w[ON], p99_seconds=None, backfill_seconds=None)
    f = contention_figures(w, backfill_alone=None)
    assert f["p99_ratio"][ON] is None and f["speed_ratio"][ON] is None
    assert f["goals_met"] == {"p99_at_most_2x": None, "backfill_at_least_half_speed": None}


def test_the_printed_lines_name_each_window_the_share_changes_and_the_goals():
    w = _windows()
    lines = contention_lines({"windows": w, "ratios": contention_figures(w, backfill_alone=60.0)})
    assert lines[0] == "serving alone: freshness p50 1.30 s, p99 1.98 s over 4 probes in 30 s (CPU: serving job 12.5 s)"
    assert lines[1] == (" adaptive off: freshness p50 7.00 s, p99 11.91 s over 4 probes in 90 s; v2's backfill "
                        "90.00 s, deploy -> ready 101.00 s (CPU: serving job 20.0 s, backfill job 80.0 s)")
    assert lines[2].strip() == ("v2's backfill estimate 80.00 s, actual 90.00 s (1.12 of the estimate, within 25%; "
                                "measured on v1)")
    assert "share changes: 3 (0.5, 0.25, 0.5)" in lines[4]
    assert lines[5] == "backfill alone (v1, nothing else running): 60.00 s from its job's start to its batch committed"
    assert lines[-1] == ("adaptive on: p99 during the backfill / p99 alone = 1.51 (goal <= 2); "
                         "backfill speed / alone = 0.75 (goal >= 0.5)")


@pytest.mark.parametrize(("argv", "message"), [
    (["--seconds", "0"], "Error: --seconds must be a positive number, got 0.0"),
    (["--rate", "-1"], "Error: --rate must be a positive number, got -1.0"),
    (["--poll", "0"], "Error: --poll must be a positive number, got 0.0"),
    (["--records", "100", "--keys", "1000"], "Error: --keys must be between 1 and --records (100), got 1,000"),
])
def test_bad_contention_arguments_end_as_one_line_and_exit_1_before_anything_starts(tmp_path, monkeypatch, argv,
                                                                                    message):
    from orchestrator.cli import app

    started = []
    monkeypatch.setattr("orchestrator.dev.broker.EmbeddedBroker.start", lambda self: started.append(self))
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "home"), "bench", "contention", *argv],
                                catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [result.stderr.strip()] and result.stderr.startswith(message)
    assert "Traceback" not in result.output and started == []
