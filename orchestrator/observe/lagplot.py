"""The catch-up curve: each version's total lag over time, drawn from the registry's lag samples.

A reprocess starts with a lag of the whole log and, if the job keeps up, falls to the catch-up
threshold; the shape of that curve (how steep, how long the tail, whether it flattens above
zero while live updates keep arriving) is what an operator wants to see before trusting a
version. Samples whose lag could not be read are unknown, never zero: they are drawn as marks
on the time axis, not as points of the curve.

When the samples carry a lag in seconds (the age of the oldest unprocessed record), a second
panel under the first draws it on the same time axis, with the pipeline's
`catchup_seconds` as a dashed line. Each change of a version's backfill share (the audit log's
``throttle`` entries, `orchestrator.lifecycle.throttle`) is a triangle on its curve, with the new share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from orchestrator.core.exceptions import ConfigError, NotFoundError
from orchestrator.core.times import to_seconds
from orchestrator.registry.store import THROTTLE_ACTION as THROTTLE

if TYPE_CHECKING:
    from orchestrator.context import VersionRef

__all__ = ["Series", "series_from_samples", "plot_lag", "plot_pipeline_lag", "is_png", "PNG_SIGNATURE"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Series:
    """One version's lag samples: `points` are (unix seconds, total lag or None for unknown)."""

    label: str
    points: list[tuple[float, int | None]]
    threshold: int | None = None
    seconds: list[tuple[float, float | None]] = field(default_factory=list)   # lag in seconds per sample
    max_lag_seconds: float | None = None
    shares: list[tuple[float, float]] = field(default_factory=list)   # (unix seconds, share from then on)

    @property
    def has_seconds(self) -> bool:
        return any(v is not None for _, v in self.seconds)


def _field(sample: Any, *names: str) -> Any:
    for name in names:
        if isinstance(sample, dict):
            if name in sample:
                return sample[name]
        elif hasattr(sample, name):
            return getattr(sample, name)
    raise AttributeError(f"lag sample {sample!r} has none of the fields {names}")


def series_from_samples(label: str, samples: Iterable[Any], threshold: int | None = None,
                        max_lag_seconds: float | None = None) -> Series:
    """Build a Series from registry lag samples (records or dicts with `at`, `total`, maybe `lag_seconds`)."""
    points, seconds = [], []
    for s in samples:
        total = _field(s, "total", "total_lag", "lag")
        at = float(to_seconds(_field(s, "at", "sampled_at", "ts")))
        points.append((at, None if total is None else int(total)))
        age = s.get("lag_seconds") if isinstance(s, dict) else getattr(s, "lag_seconds", None)
        seconds.append((at, None if age is None else float(age)))
    points.sort(key=lambda p: p[0])
    seconds.sort(key=lambda p: p[0])
    return Series(label=label, points=points, threshold=threshold, seconds=seconds, max_lag_seconds=max_lag_seconds)


def plot_lag(series: list[Series], out: Path | str, *, title: str = "Catch-up: lag over time") -> Path:
    """Write a PNG of each series' lag (records) against seconds since its first sample.

    Each curve starts at its own zero so that catch-ups of different versions compare
    directly. Raises ConfigError when no series holds a sample: an empty plot would look
    like a version that never lagged.
    """
    series = [s for s in series if s.points]
    if not series:
        raise ConfigError(
            "no lag samples to plot: the registry has none for the versions asked for; "
            "samples are recorded while a version is watched (`kappa status --watch`, "
            "`kappa deploy --wait`, the monitor DAG)"
        )
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    with_seconds = any(s.has_seconds for s in series)
    fig = Figure(figsize=(9, 8 if with_seconds else 5), dpi=110)
    ax = fig.add_subplot(2, 1, 1) if with_seconds else fig.add_subplot(1, 1, 1)
    top = 0
    marks: list[tuple[float, str, str]] = []
    colors: list[str] = []
    for s in series:
        t0 = s.points[0][0]
        xs = [t - t0 for t, v in s.points if v is not None]
        ys = [v for _, v in s.points if v is not None]
        unknown = [t - t0 for t, v in s.points if v is None]
        (line,) = ax.plot(xs, ys, marker="o", markersize=2.5, linewidth=1.6, label=s.label)
        colors.append(line.get_color())
        if unknown:
            ax.plot(unknown, [0] * len(unknown), linestyle="none", marker="x", color=line.get_color(),
                    label=f"{s.label}: lag unknown")
        if ys:
            top = max(top, max(ys))
            _share_marks(ax, s, xs, ys, t0, line.get_color())
        if s.threshold is not None and ys:
            reached = next((x for x, y in zip(xs, ys) if y <= s.threshold), None)
            if reached is not None:
                ax.axvline(reached, color=line.get_color(), linestyle=":", linewidth=1)
                marks.append((reached, line.get_color(), f"{s.label}: lag <= {s.threshold:,} after {reached:.0f} s"))
    if with_seconds:
        _seconds_panel(fig.add_subplot(2, 1, 2, sharex=ax), series, colors)
    else:
        ax.set_xlabel("seconds since the version's first lag sample")
    ax.set_ylabel("total lag (records)")
    ax.set_ylim(bottom=0, top=max(1, math.ceil(top * 1.08)))
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    for i, (x, color, text) in enumerate(marks):
        ax.annotate(text, (x, top * (0.55 - 0.08 * i)), xytext=(6, 0), textcoords="offset points",
                    fontsize=8, color=color, va="center")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def _share_marks(ax: Any, s: Series, xs: list[float], ys: list[int], t0: float, color: str) -> None:
    """Each change of the version's backfill share, marked on its curve where it happened."""
    for at, share in s.shares:
        x = at - t0
        if x < xs[0] or x > xs[-1]:
            continue
        y = next(y for xx, y in zip(reversed(xs), reversed(ys)) if xx <= x)   # the curve's value then
        ax.plot([x], [y], linestyle="none", marker="v", markersize=7, color=color)
        ax.annotate(f"share {share:g}", (x, y), xytext=(3, 6), textcoords="offset points", fontsize=7, color=color)


def _seconds_panel(ax: Any, series: list[Series], colors: list[str]) -> None:
    """Lag in seconds per version, same colours and time origin as the records panel above."""
    limits = set()
    for color, s in zip(colors, series):
        t0 = s.points[0][0]
        xs = [t - t0 for t, v in s.seconds if v is not None]
        ys = [v for _, v in s.seconds if v is not None]
        if ys:
            ax.plot(xs, ys, marker="o", markersize=2.5, linewidth=1.6, color=color, label=s.label)
        if s.max_lag_seconds is not None and s.max_lag_seconds not in limits:
            limits.add(s.max_lag_seconds)
            ax.axhline(s.max_lag_seconds, color="grey", linestyle="--", linewidth=1,
                       label=f"catchup_seconds {s.max_lag_seconds:g}")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds since the version's first lag sample")
    ax.set_ylabel("lag (seconds behind)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)


def plot_pipeline_lag(versions: list[VersionRef], out: Path | str, limit: int = 100_000) -> Path:
    """Plot the catch-up curves of versions of one pipeline from the registry's lag samples."""
    from orchestrator.observe.lag import version_threshold

    if not versions:
        raise NotFoundError("no version to plot: deploy one first (`kappa deploy PIPELINE`)")
    pipeline = versions[0].pipeline
    series = []
    for v in versions:
        samples = v.registry.lag_samples(v.pipeline, v.version, limit=limit)
        try:
            threshold = version_threshold(v)
        except (TypeError, ValueError):  # a malformed override: the declared threshold
            threshold = v.spec.catchup_threshold
        one = series_from_samples(str(v), samples, threshold, v.spec.catchup_seconds)
        shares = [(e.at, float(e.details["to"])) for e in
                  v.registry.audit_log(v.pipeline, limit=None, version=v.version, action=THROTTLE)
                  if e.details.get("to") is not None]
        series.append(replace(one, shares=shares) if shares else one)
    return plot_lag(series, out, title=f"{pipeline}: catch-up (total lag over time)")


def is_png(path: Path | str) -> bool:
    p = Path(path)
    return p.is_file() and p.stat().st_size > len(PNG_SIGNATURE) and p.read_bytes()[:8] == PNG_SIGNATURE
