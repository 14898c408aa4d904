"""Lag going down, on a terminal: rich progress bars fed by readiness samples.

A version's bar measures how much of the lag it has worked off: its total is the highest lag
seen since the watch began (the backlog when it started, grown by whatever live updates arrived
since) and its completed part is that peak minus the current lag. Next to the bar: the lag in
records, how old the oldest unprocessed record is (lag in seconds, when known), the ETA the
control plane computed from the recent rate, and the readiness state.

On a terminal the bars redraw in place. When output is not a terminal (a log file, a test, a
pipe) each sample is one plain line instead, so the record of a catch-up stays readable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from orchestrator.observe.lag import fmt_lag, fmt_seconds

__all__ = ["LagProgress", "fmt_count", "fmt_eta", "make_console"]

STATE_STYLE = {"ready": "green", "hydrating": "cyan", "lagging": "yellow", "failing": "red", "stopped": "magenta"}


def fmt_count(n: int | None) -> str:
    return "unknown" if n is None else f"{n:,}"


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return "0 s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"


def _get(r: Any, name: str, default: Any = None) -> Any:
    if isinstance(r, dict):
        return r.get(name, default)
    return getattr(r, name, default)


@dataclass
class _Row:
    task: TaskID | None
    peak: int = 0
    last_line: float = 0.0
    samples: int = 0


@dataclass
class LagProgress:
    """Progress bars of lag per version. Use as a context manager; call `update(readiness)`.

    `readiness` is an `orchestrator.lifecycle.await_ready.Readiness` (or its `to_dict()`): pipeline,
    version, state, total_lag (None = unknown), eta_seconds, consecutive_ok, required_samples,
    threshold, and optionally lag_seconds, catchup_seconds, floored and unread.
    """

    console: Console
    line_every: float = 0.0          # non-terminal output: at most one line per version per this many s
    transient: bool = False
    _progress: Progress | None = field(default=None, init=False, repr=False)
    _rows: dict[tuple[str, int], _Row] = field(default_factory=dict, init=False, repr=False)

    @property
    def live(self) -> bool:
        return self.console.is_terminal

    def __enter__(self) -> "LagProgress":
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(bar_width=36),
                TextColumn("{task.percentage:>5.1f}%"),
                TextColumn("lag [bold]{task.fields[lag]}[/]{task.fields[age]}"),
                TextColumn("ETA {task.fields[eta]}"),
                TextColumn("{task.fields[state]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=self.transient,
                refresh_per_second=4,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
            self._progress = None

    def update(self, r: Any) -> None:
        pipeline, version = _get(r, "pipeline"), int(_get(r, "version"))
        lag = _get(r, "total_lag")
        state = _get(r, "state", "?")
        eta = fmt_eta(_get(r, "eta_seconds"))
        key = (pipeline, version)
        row = self._rows.get(key)
        if row is None:
            task = None
            if self._progress is not None:
                task = self._progress.add_task(f"{pipeline} v{version}", total=1, completed=0,
                                               lag="?", age="", eta="-", state="")
            row = self._rows[key] = _Row(task)
        row.samples += 1
        if lag is not None:
            row.peak = max(row.peak, lag)
        style = STATE_STYLE.get(state, "white")
        ok = f"{_get(r, 'consecutive_ok', 0)}/{_get(r, 'required_samples', '?')}"
        state_text = f"[{style}]{state}[/] ({ok} samples {_limits(r)})"
        age = f", {fmt_seconds(_get(r, 'lag_seconds'))} behind"
        lag_text = fmt_lag(lag, floored=bool(_get(r, "floored")), unread=_get(r, "unread"))
        if state == "failing" and _get(r, "reason"):
            state_text += f": {_get(r, 'reason')}"
        if self._progress is not None and row.task is not None:
            total = max(row.peak, 1)
            done = total if state == "ready" else (total - lag if lag is not None else 0)
            self._progress.update(row.task, total=total, completed=max(0, done), lag=lag_text, age=age,
                                  eta=eta, state=state_text)
            return
        now = time.monotonic()
        if state == "ready" or now - row.last_line >= self.line_every:
            row.last_line = now
            worked_off = row.peak - lag if lag is not None else 0
            pct = 100.0 if state == "ready" else (100.0 * worked_off / row.peak if row.peak else 0.0)
            self.console.print(f"  {pipeline} v{version}: lag {lag_text:>9} ({pct:5.1f}% caught up from a peak of "
                               f"{row.peak:,}), ETA {eta}, {state_text}{age}", highlight=False)


def _limits(r: Any) -> str:
    """'<= 100, <= 30 s old': the two catch-up limits, records and seconds."""
    threshold = _get(r, "threshold")
    records = f"<= {threshold:,}" if isinstance(threshold, int) else "<= ?"
    return f"{records}, <= {fmt_seconds(_get(r, 'catchup_seconds'))} old"


def make_console(stderr: bool = False) -> Console:
    """A console that does not wrap lines at 80 columns when its output is not a terminal."""
    probe = Console(stderr=stderr)
    if probe.is_terminal:
        return Console(stderr=stderr, highlight=False)
    return Console(stderr=stderr, highlight=False, width=max(probe.width, 160), soft_wrap=True)
