"""`kappa bench contention`: what a reprocess costs the version that serves, with the adaptive share off and on.

On the demo's embedded stack in a temporary home: fill a compacted profiles topic (2M records by
default), deploy v1 with nothing else running and time its backfill (its job's start to its one
backfill batch committed, as the version's measured backfill records it: the reference, *alone*),
promote it. From then on a live producer updates member profiles at `rate` a second and a reader
polls the alias, as `bench freshness` does (produce -> readable through the alias). After `warmup` seconds (the serving job's first live micro-batches compile their code),
three windows follow, on the same stack, one after the other:

1. **serving alone**: `seconds` of live updates, nothing else running;
2. **adaptive off**: a new version deployed, its share fixed at the full machine (`kappa throttle
   --share 1`), from its deploy until it is ready;
3. **adaptive on**: another new version with the pipeline's adaptive share, the control plane's
   controller stepping every interval, from its deploy until it is ready.

Each new version is stopped once ready. The figures: freshness p50/p99 of the probes sent in each
window, each backfill's time (and deploy -> ready beside it: that adds the catch-up with the live
log, which a backfill alone has not), the ratios the issue's goals are about (p99 during a backfill
over p99 alone: at most 2 with the adaptive mode on; backfill alone over backfill in the mode: at
least 0.5), the share changes the controller made, and the CPU seconds of each job's processes beside wall time.
Everything started is stopped by PID at the end.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from orchestrator.core.exceptions import ConfigError, LifecycleError
from orchestrator.dev.benchutil import fmt_seconds, percentile, positive, ratio, write_figures

__all__ = ["Window", "window_figures", "contention_figures", "contention_lines", "run_contention_bench"]

ALONE, OFF, ON = "serving alone", "adaptive off", "adaptive on"
#: The issue's goals: p99 during the adaptive backfill at most this many times p99 alone, and the
#: adaptive backfill at least this fraction of its speed alone.
P99_GOAL, SPEED_GOAL = 2.0, 0.5


@dataclass
class Window:
    """One measured window: its name, its monotonic bounds, and what ran in it."""

    name: str
    start: float
    end: float
    backfill_seconds: float | None = None        # its job's start -> its backfill batch committed
    ready_seconds: float | None = None           # deploy -> ready (the backfill, then the live catch-up)
    version: int | None = None
    serving_cpu_seconds: float | None = None     # the serving job's processes over the window
    backfill_cpu_seconds: float | None = None    # the new version's job processes, deploy -> ready
    share_changes: list[dict[str, Any]] = field(default_factory=list)
    estimate: dict[str, Any] | None = None       # the deploy's backfill estimate beside the actual


def window_figures(w: Window, latencies: list[float]) -> dict[str, Any]:
    """A window's figures from the latencies of the probes sent in it (pure: tested)."""
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    return {"name": w.name, "seconds": round(w.end - w.start, 2), "probes": len(latencies),
            "p50_seconds": None if p50 is None else round(p50, 3), "p99_seconds": None if p99 is None else round(p99, 3),
            "backfill_seconds": None if w.backfill_seconds is None else round(w.backfill_seconds, 2),
            "ready_seconds": None if w.ready_seconds is None else round(w.ready_seconds, 2),
            "version": w.version, "serving_cpu_seconds": w.serving_cpu_seconds,
            "backfill_cpu_seconds": w.backfill_cpu_seconds, "share_changes": list(w.share_changes),
            "estimate": w.estimate}


def contention_figures(windows: dict[str, dict[str, Any]], backfill_alone: float | None) -> dict[str, Any]:
    """The ratios the goals are about, from the windows' figures and the backfill alone (pure: tested).

    `p99_ratio[mode]` = p99 during that mode's backfill / p99 alone (lower is better; goal <= 2 with
    the adaptive mode on); `speed_ratio[mode]` = backfill alone / backfill in that mode (the fraction
    of its speed alone the backfill kept; goal >= 0.5)."""
    alone = windows.get(ALONE, {})
    out: dict[str, Any] = {"backfill_alone_seconds": None if backfill_alone is None else round(backfill_alone, 2),
                           "p99_ratio": {}, "speed_ratio": {}}
    for mode in (OFF, ON):
        w = windows.get(mode)
        if w is None:
            continue
        out["p99_ratio"][mode] = ratio(w.get("p99_seconds"), alone.get("p99_seconds"), 2)
        out["speed_ratio"][mode] = ratio(backfill_alone, w.get("backfill_seconds"), 2)
    on_p99, on_speed = out["p99_ratio"].get(ON), out["speed_ratio"].get(ON)
    out["goals_met"] = {"p99_at_most_2x": None if on_p99 is None else on_p99 <= P99_GOAL,
                        "backfill_at_least_half_speed": None if on_speed is None else on_speed >= SPEED_GOAL}
    return out


def contention_lines(f: dict[str, Any]) -> list[str]:
    """The printed result (pure: tested)."""
    lines = []
    for w in f["windows"].values():
        line = (f"{w['name']:>13}: freshness p50 {fmt_seconds(w['p50_seconds'])}, p99 {fmt_seconds(w['p99_seconds'])} "
                f"over {w['probes']:,} probes in {w['seconds']:.0f} s")
        if w.get("backfill_seconds") is not None:
            line += f"; v{w['version']}'s backfill {fmt_seconds(w['backfill_seconds'])}"
        if w.get("ready_seconds") is not None:
            line += f", deploy -> ready {fmt_seconds(w['ready_seconds'])}"
        cpu = [f"serving job {w['serving_cpu_seconds']:.1f} s" if w.get("serving_cpu_seconds") is not None else "",
               f"backfill job {w['backfill_cpu_seconds']:.1f} s" if w.get("backfill_cpu_seconds") is not None else ""]
        if any(cpu):
            line += " (CPU: " + ", ".join(c for c in cpu if c) + ")"
        lines.append(line)
        est = w.get("estimate")
        if est:
            lines.append(f"{'':>13}  v{w['version']}'s backfill estimate {fmt_seconds(est['estimate_seconds'])}, actual "
                         f"{fmt_seconds(est['actual_seconds'])} ({est['ratio']:.2f} of the estimate, "
                         f"{'within' if est['within_goal'] else 'outside'} 25%; {est.get('rate_source')})")
        if w.get("share_changes"):
            shares = ", ".join(f"{c.get('to')}" for c in w["share_changes"])
            lines.append(f"{'':>13}  share changes: {len(w['share_changes'])} ({shares})")
    r = f["ratios"]
    lines.append(f"backfill alone (v1, nothing else running): {fmt_seconds(r['backfill_alone_seconds'])} from its job's "
                 f"start to its batch committed"
                 + (f"; deploy -> ready {fmt_seconds(r['ready_alone_seconds'])}" if r.get("ready_alone_seconds") else ""))
    for mode in (OFF, ON):
        if mode in r["p99_ratio"]:
            p99, speed = r["p99_ratio"][mode], r["speed_ratio"][mode]
            lines.append(f"{mode}: p99 during the backfill / p99 alone = {p99 if p99 is not None else '-'}"
                         f"{f' (goal <= {P99_GOAL:g})' if mode == ON else ''}; backfill speed / alone = "
                         f"{speed if speed is not None else '-'}{f' (goal >= {SPEED_GOAL:g})' if mode == ON else ''}")
    return lines


def _poller(k, alias: str, probes, stop: threading.Event, poll: float, errors: list[str]) -> None:
    from orchestrator.dev.freshbench import poll_alias

    state: dict[str, Any] = {}
    while not stop.is_set():
        try:
            poll_alias(k, alias, probes, state)
        except Exception as e:  # noqa: BLE001 - reported by the benchmark, never swallowed
            errors.append(f"reader: {type(e).__name__}: {e}")
            return
        stop.wait(poll)


def _supervise(k, spec, stop: threading.Event, actor: str, errors: list[str]) -> None:
    """What `kappa supervise` does, in a thread: a monitor pass (lag samples, supervision, the backfill
    share controller's step) every `backfill_interval_seconds` of the pipeline."""
    from orchestrator.lifecycle.monitor import monitor

    while not stop.is_set():
        try:
            monitor(k, actor=actor, pipelines=[spec.name], raise_on_problem=False)
        except Exception as e:  # noqa: BLE001 - reported by the benchmark, never swallowed
            errors.append(f"supervisor: {type(e).__name__}: {e}")
            return
        stop.wait(spec.backfill_interval_seconds)


def _cpu(pid: int | None) -> float | None:
    from orchestrator.dev.benchutil import process_cpu_seconds

    if not pid:
        return None
    try:
        return process_cpu_seconds(pid)
    except Exception:  # noqa: BLE001 - the process ended: no figure
        return None


def run_contention_bench(seconds: float = 30.0, rate: float = 20.0, *, records: int = 2_000_000,
                         keys: int = 500_000, partitions: int = 4, value_size: int = 200, rules: str = "v2",
                         poll: float = 0.1, drain: float = 20.0, warmup: float = 15.0, deadline: float = 1800.0, console=None,
                         overrides: dict[str, Any] | None = None, json_out=None,
                         on_window: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the contention benchmark (module docstring); print and return its figures."""
    positive(seconds, "--seconds")
    positive(rate, "--rate")
    positive(poll, "--poll")
    if keys < 1 or records < keys:
        raise ConfigError(f"--keys must be between 1 and --records ({records:,}), got {keys:,}")
    from rich.console import Console

    from orchestrator.dev.demo import ACTOR, PIPELINE, Demo, DemoOptions
    from orchestrator.dev.freshbench import Probes, produce_probes
    from orchestrator.jobctl import stop_version
    from orchestrator.lifecycle.await_ready import wait_ready
    from orchestrator.lifecycle.deploy import deploy
    from orchestrator.lifecycle.promote import promote
    from orchestrator.lifecycle.throttle import set_throttle, throttle_changes
    from orchestrator.observe.estimate import compare

    console = console or Console(highlight=False)
    bench = Demo(DemoOptions(records=records, keys=keys, partitions=partitions, malformed_share=0.0, clean=True,
                             value_size=value_size, batch=None), console, overrides)
    figures: dict[str, Any] = {"params": {"seconds": seconds, "rate": rate, "records": records, "keys": keys,
                                          "partitions": partitions, "value_size": value_size, "rules": rules,
                                          "poll_seconds": poll, "warmup_seconds": warmup}, "windows": {}}
    stop, reading, errors, probes = threading.Event(), threading.Event(), [], Probes()
    threads: list[threading.Thread] = []
    windows: list[Window] = []
    ok = False

    def on_term(signum, frame):      # `timeout` or a Ctrl-C from a supervisor: still stop all by PID
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, on_term) if threading.current_thread() is threading.main_thread() else None
    try:
        bench.home = bench._make_home()
        bench.section("Embedded broker and a compacted topic")
        bench.start_broker()
        bench.fill_topic()
        k = bench.k
        spec = k.pipeline(PIPELINE)
        figures["params"].update(lag_bound_seconds=spec.backfill_lag_bound,
                                 interval_seconds=spec.backfill_interval_seconds)

        def deploy_until_ready(why: str, *, share: float | None) -> tuple[Any, float, float | None]:
            t0 = time.monotonic()
            # the pipeline's own catch-up limits: with the live producer running, a lag of 0 never comes
            info = deploy(k, spec, rules, actor=ACTOR, reason=f"contention benchmark: {why}")
            if info.pid:
                bench.started.job_pids[info.version] = info.pid
            v = k.version(spec, info.version)
            if share is not None:
                set_throttle(v, actor=ACTOR, share=share, reason="contention benchmark: the adaptive mode off")
            wait_ready(v, deadline_seconds=deadline, poll_seconds=0.5, actor=ACTOR)
            took = time.monotonic() - t0
            backfill = (v.reread().record.details or {}).get("backfill") or {}
            return v, took, backfill.get("seconds"), _cpu(info.pid)

        bench.section("v1 alone: deploy -> ready with nothing else running (the backfill's reference)")
        v1, alone_ready, alone_backfill, _cpu1 = deploy_until_ready("the reference, alone", share=None)
        bench.say(f"v1's backfill {fmt_seconds(alone_backfill)} (its job's start -> its batch committed); "
                  f"ready {alone_ready:.1f} s after its deploy")
        bench.say(promote(v1, actor=ACTOR, reason="contention benchmark").message)
        serving_pid = (v1.reread().record.pid)

        bench.section(f"live producer {rate:g} updates/s and a reader of alias {spec.alias} from now on")
        run = f"{time.time_ns() % 10**9}"
        threads.append(threading.Thread(target=produce_probes, name="kappa-bench-contention-producer", daemon=True,
                                        args=(k.bootstrap_servers, spec.topics[0], rate, 10 ** 9, keys, run, probes,
                                              stop, errors)))
        threads.append(threading.Thread(target=_poller, name="kappa-bench-contention-reader", daemon=True,
                                        args=(k, spec.alias, probes, reading, poll, errors)))
        for t in threads:
            t.start()

        def window(name: str, body: Callable[[Window], None]) -> None:
            bench.section(name)
            if on_window is not None:
                on_window(name)
            cpu0 = _cpu(serving_pid)
            w = Window(name, time.monotonic(), 0.0)
            body(w)
            w.end = time.monotonic()
            cpu1 = _cpu(serving_pid)
            w.serving_cpu_seconds = None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 2)
            windows.append(w)
            if errors:
                raise LifecycleError(f"the benchmark's {errors[0]}")
            lat = probes.sent_between(w.start, w.end)
            bench.say(f"{name}: {len(lat):,} probes readable so far, p50 {fmt_seconds(percentile(lat, 50))}, "
                      f"p99 {fmt_seconds(percentile(lat, 99))}")

        bench.say(f"the backfill yields while {spec.alias} is more than {spec.backfill_lag_bound:g} s behind "
                  f"(backfill_lag_bound_seconds), one change per {spec.backfill_interval_seconds:g} s at most; "
                  f"warming up the serving job for {warmup:g} s")
        stop.wait(warmup)    # its first live micro-batches compile their code: not the steady state
        window(ALONE, lambda w: stop.wait(seconds))

        def backfill(mode: str) -> Callable[[Window], None]:
            def body(w: Window) -> None:
                ctl_stop = threading.Event()
                ctl = None
                if mode == ON:
                    ctl = threading.Thread(target=_supervise, name="kappa-bench-contention-supervisor",
                                           daemon=True, args=(k, spec, ctl_stop, ACTOR, errors))
                    ctl.start()
                try:
                    v, took, backfill_took, cpu = deploy_until_ready(mode, share=1.0 if mode == OFF else None)
                finally:
                    ctl_stop.set()
                    if ctl is not None:
                        ctl.join(30)
                w.version, w.backfill_cpu_seconds = v.version, cpu
                w.backfill_seconds, w.ready_seconds = backfill_took, took
                w.share_changes = throttle_changes(v, limit=1000)
                details = v.reread().record.details or {}
                w.estimate = compare(details.get("estimate"), details.get("backfill"))
                bench.say(f"v{v.version}'s backfill {fmt_seconds(backfill_took)}, ready {took:.1f} s after its "
                          f"deploy; stopping it")
                stop_version(v, actor=ACTOR, reason="contention benchmark: measured")
            return body

        window(OFF, backfill(OFF))
        stop.wait(drain)     # the serving version settles before the next window
        window(ON, backfill(ON))
        stop.set()                                   # the producer stops; the reader drains
        threads[0].join(40)
        until = time.monotonic() + drain
        while probes.pending and time.monotonic() < until:
            time.sleep(poll)
        reading.set()
        threads[1].join(40)
        for w in windows:
            figures["windows"][w.name] = window_figures(w, probes.sent_between(w.start, w.end))
        figures["ratios"] = contention_figures(figures["windows"], alone_backfill)
        figures["ratios"]["ready_alone_seconds"] = round(alone_ready, 2)
        ok = True
    finally:
        stop.set()
        reading.set()
        for t in threads:
            t.join(40)
        for what, pid in bench.cleanup():
            console.print(f"stopped {what} (pid {pid})", highlight=False)
        if bench.home is not None and bench.temp_home:
            shutil.rmtree(bench.home, ignore_errors=True)
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    if ok:
        for line in contention_lines(figures):
            console.print(line, highlight=False)
    write_figures(json_out, figures)
    return figures
