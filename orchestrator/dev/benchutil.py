"""What the benchmarks share: rates, ratios, percentiles, sizes given as "4M", peak memory.

Pure functions except `PeakMemory`, which samples the resident memory of a process tree.
"""

from __future__ import annotations

import json
import math
import re
import threading
from pathlib import Path
from typing import Any, Iterable, Sequence

from orchestrator.core.exceptions import ConfigError

__all__ = ["process_cpu_seconds", "rate", "ratio", "percentile", "parse_count", "parse_counts", "parse_json_object", "PeakMemory", "write_figures",
           "positive", "fmt_seconds"]

_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def process_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system) of a process and of its live descendants (a driver, its JVM, the
    JVM's Python workers), plus the children it has already waited for."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system + (t.children_user + t.children_system if proc is root else 0.0)
        except psutil.Error:
            continue
    return round(total, 2)


def rate(records: int, size: int, seconds: float) -> dict[str, Any]:
    """records, bytes, seconds and the rates they make (records/s, MB/s of 10^6 bytes)."""
    seconds = max(float(seconds), 1e-9)
    return {"records": int(records), "bytes": int(size), "seconds": round(seconds, 3),
            "records_per_s": round(records / seconds), "mb_per_s": round(size / seconds / 1e6, 2)}


def ratio(value: float | None, reference: float | None, digits: int = 3) -> float | None:
    """value / reference, None when either is missing or the reference is not positive."""
    if value is None or reference is None or reference <= 0:
        return None
    return round(value / reference, digits)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between ranks (numpy's default);
    None for no values."""
    if not 0 <= q <= 100:
        raise ConfigError(f"a percentile must be between 0 and 100, got {q}")
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def parse_count(text: str | int, what: str = "size") -> int:
    """'4M' -> 4000000, '250k' -> 250000, '1.5M' -> 1500000, 1000 -> 1000; ConfigError otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        n = text
    else:
        m = _COUNT.match(str(text))
        if not m:
            raise ConfigError(f"{what} {text!r} is not a record count: write e.g. 1000000, 250k or 4M")
        n = round(float(m.group(1)) * {"": 1, "k": 1_000, "m": 1_000_000}[m.group(2).lower()])
    if n < 1:
        raise ConfigError(f"{what} must be at least 1 record, got {text!r}")
    return n


def parse_counts(text: str, what: str = "--sizes") -> list[int]:
    """'1M,4M' -> [1000000, 4000000]: distinct, in the order given; ConfigError on a bad item."""
    items = [t for t in (s.strip() for s in str(text).split(",")) if t]
    if not items:
        raise ConfigError(f"{what} names no size: write e.g. 1M,4M")
    out: list[int] = []
    for t in items:
        n = parse_count(t, f"{what} item")
        if n in out:
            raise ConfigError(f"{what} gives {t!r} twice: each size once, e.g. 1M,4M")
        out.append(n)
    return out


def positive(value: float, name: str) -> float:
    """`value` if it is a positive number; ConfigError naming the option otherwise."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or math.isinf(value):
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
    return value


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def write_figures(path: str | Path | None, figures: dict) -> None:
    if path is None:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(figures, indent=2, default=str) + "\n", encoding="utf-8")


class PeakMemory:
    """The largest sum of resident memory of a process tree, sampled every `interval` seconds.

    `pid` is the tree's root (default: this process); `exclude` are PIDs whose subtrees are not
    counted (none by default).
    """

    def __init__(self, pid: int | None = None, interval: float = 0.2, exclude: Iterable[int] = ()):
        import psutil

        self.proc = psutil.Process(pid)
        self.interval = interval
        self.exclude = set(exclude)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kappa-bench-memory", daemon=True)

    def sample(self) -> int:
        import psutil

        total = 0
        try:
            procs = [self.proc, *self.proc.children(recursive=True)]
        except psutil.Error:
            return 0
        for p in procs:
            if p.pid in self.exclude:
                continue
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        self.peak = max(self.peak, total)
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> "PeakMemory":
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        return self.peak

    def __enter__(self) -> "PeakMemory":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def parse_json_object(text: str | None, option: str = "--extra") -> dict[str, Any]:
    """A JSON object given on the command line ({} for none); ConfigError naming the option otherwise."""
    if text is None or not str(text).strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{option} is not valid JSON ({e.msg} at character {e.pos}): give an object, "
                          f"e.g. '{{\"read\": \"spark\"}}'") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{option} must be a JSON object, e.g. '{{\"read\": \"spark\"}}', got {type(value).__name__}")
    return value
