"""`kappa up`: everything a new user needs to click through kappa in the Airflow UI, in one command.

It starts what `kappa demo` starts (the embedded broker, the compacted `member_profiles` topic
filled with profile changes, a live producer of updates), fills the seed pipelines' topics (page
views, member settings, ad impressions and clicks), deploys v1 of `standardize` with the v1 rules
and promotes it once it has caught up, then starts Airflow for that kappa home and prints the UI's
address and login. The trigger form offers the pipelines whose topics hold data (with a pipelines
file of one's own, those reading other topics are left out, and `kappa up` says so). It runs until Ctrl-C (or SIGTERM), then stops everything it started,
by PID: Airflow's components, the jobs of every version (those the UI started too), the producer
and the broker, and says that nothing is left running.

In the UI: trigger `kappa_reprocess` with rules v2 (the new title rules), watch it in the run's
task logs (lag, ETA, the validation report), and roll back with `kappa_rollback`. The kappa home
stays afterwards (registry, tables, plots, and the broker's data under `<home>/broker/`).
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from orchestrator.dev.demo import PIPELINE, Demo, DemoOptions
from orchestrator.dev.demo_stop import report_stopped
from orchestrator.jobctl.launch import reap_children

__all__ = ["UpOptions", "run_up"]


@dataclass
class UpOptions:
    home: Path | None = None
    records: int = 20_000
    keys: int = 5_000
    rate: float = 5.0
    port: int = 0                 # 0: a free port on 127.0.0.1
    username: str = "admin"
    password: str = "admin"
    airflow_timeout: float = 300.0


class Up(Demo):
    """The demo's embedded stack and v1, then Airflow on top; `serve` waits for the stop signal."""

    actor = "kappa-up"
    end_reason = "kappa up stopped"

    def __init__(self, opts: UpOptions, console: Console, overrides: dict[str, Any] | None = None):
        super().__init__(DemoOptions(home=opts.home, records=opts.records, keys=opts.keys, rate=opts.rate,
                                     batch=None), console, overrides)
        self.up = opts
        self.stack = None

    def run(self) -> None:  # the setup; `serve` then waits
        self.home = self._make_home()
        self.section("The embedded stack: broker, compacted topic, live updates")
        self.start_broker()
        self.fill_topic()
        self.fill_seed_topics()
        self.start_producer()
        self.alias = self.k.pipeline(PIPELINE).alias
        self.section("v1 with the v1 rules: deploy, catch up, promote")
        v1 = self.deploy_and_wait("v1", self.threshold(), "kappa up: the first version")
        self.promote(v1, "kappa up: first version goes live")
        self.section("Airflow for this kappa home")
        self.start_airflow(self.offered_settings())

    def fill_seed_topics(self) -> None:
        """Data for the other pipelines the trigger form offers (deploy/pipelines.toml's seed pipelines):
        page views, member settings, ad impressions and clicks of the same members, a few seconds' worth."""
        from orchestrator.dev.seedgen import produce_demo_events

        members = min(self.opts.keys, 1000)
        t0 = time.monotonic()
        counts = produce_demo_events(self.k.bootstrap_servers, members=members, views=5 * members,
                                     impressions=2 * members, partitions=self.opts.partitions)
        self.say("seed pipelines' topics: " + ", ".join(f"{topic} {n:,}" for topic, n in counts.items())
                 + f" records ({time.monotonic() - t0:.1f} s)")

    def offered_settings(self):
        """The settings Airflow runs with: the pipelines file, less the pipelines whose topics hold no data."""
        from orchestrator.dev.up_data import pipelines_without_data, write_pipelines_subset

        settings = self.k.settings
        missing = pipelines_without_data(self.k)
        if not missing:
            self.say(f"the trigger form offers the {len(self.k.pipelines)} pipelines of {settings.pipelines_file}: "
                     f"the topics of each hold data")
            return settings
        keep = [name for name in self.k.pipelines if name not in missing]
        why = "; ".join(f"{name} ({', '.join(reasons)})" for name, reasons in missing.items())
        path = write_pipelines_subset(settings.pipelines_file, self.home / "pipelines.up.toml", keep)
        if path is None:
            self.say(f"[yellow]no data for: {why}. The trigger form offers them, but a reprocess of them fails "
                     f"until their topics on {self.k.bootstrap_servers} hold data[/]")
            return settings
        self.say(f"[yellow]left out of the trigger form, no data: {why}. kappa up fills only its own topics; "
                 f"Airflow reads {path}, with {', '.join(keep)}[/]")
        return settings.model_copy(update={"pipelines_file": path})

    def start_airflow(self, settings) -> None:
        from orchestrator.airflow import stack as airflow_stack

        self.say("starting Airflow (db migrate, api-server, scheduler, dag-processor, triggerer); "
                 "this takes a minute or two")
        self.stack = airflow_stack.start(settings, self.up.port or None, username=self.up.username,
                                         password=self.up.password, timeout=self.up.airflow_timeout)
        s = self.stack
        self.say(f"Airflow runs, logs in {s.log_dir}; pids " + ", ".join(f"{c} {p}" for c, p in s.pids.items()))

    def show_ready(self) -> None:
        s = self.stack
        served = self.k.registry.get_alias(self.alias)
        rec = self.k.registry.get_version(PIPELINE, served.version)
        self.section("kappa is up")
        self.say(f"Airflow UI: {s.url}  (login {s.username} / {self.up.password})")
        self.say(f"serving: alias {self.alias} -> {PIPELINE} v{served.version} (rules {rec.rules_version}); "
                 f"kappa home {self.home}")
        self.say("In the UI:")
        for line in walk_through(self.pipeline, self.k.pipeline(self.pipeline).grace_period_seconds):
            self.say(line)
        self.say(f"From a terminal: kappa --home {self.home} status --watch   |   kappa --home {self.home} history")
        self.say("[bold]Press Ctrl-C to stop everything kappa up started.[/]")

    def other_pipelines(self) -> list[str]:
        """Every other pipeline of the registry: the UI may have reprocessed any the form offers."""
        from orchestrator.core.exceptions import KappaError

        try:
            return [p.name for p in self.k.registry.list_pipelines() if p.name != self.pipeline]
        except KappaError as e:
            self.say(f"[red]could not list the pipelines of the registry ({e}); stopping {self.pipeline}'s jobs only[/]")
            return []

    def stopped_by(self, signum: int) -> None:
        """Record the signal that ends `kappa up`, for the audit entries of the jobs it stops."""
        name = signal.Signals(signum).name
        self.end_reason = f"kappa up stopped ({name}, Ctrl-C)" if signum == signal.SIGINT else \
            f"kappa up stopped ({name})"

    def stop_others(self) -> Callable[[], list[tuple[str, int]]]:
        """Stop Airflow's components in a thread, while the jobs stop; the wait joins it."""
        stack = self.stack
        if stack is None:
            return super().stop_others()
        pids = dict(stack.pids)
        done: dict[str, Any] = {}

        def body() -> None:
            try:
                done["stopped"] = stack.stop()
            except Exception as e:  # reported by the wait; the jobs and the broker still stop
                done["error"] = e

        thread = threading.Thread(target=body, name="kappa-up-stop-airflow", daemon=True)
        thread.start()

        def wait() -> list[tuple[str, int]]:
            thread.join()
            if "error" in done:
                self.say(f"[red]stopping Airflow failed: {done['error']}[/]")
                return [(f"Airflow {comp}", pid) for comp, pid in pids.items()]  # checked for being left
            return [(f"Airflow {comp}", pids.get(comp, 0)) for comp in done.get("stopped", [])]

        return wait


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g} s"


def walk_through(pipeline: str, grace_seconds: float) -> list[str]:
    """The steps `kappa up` suggests in the UI; what each run shows and what a rollback costs when."""
    grace = _duration(grace_seconds)
    if grace_seconds > 0:
        standby = (f"v1 stays a running standby for the grace period ({grace} for {pipeline} unless the form sets "
                   f"another), then kappa_monitor stops it")
        back = (f"back to v1: instant while v1 is a standby (the grace period after a promote, {grace} by "
                f"default); after that v1 restarts from its checkpoint, about 30 s here, and the run's note shows "
                f"its progress")
    else:
        standby = f"v1 is stopped at the flip (the grace period of {pipeline} is 0)"
        back = "back to v1: v1 restarts from its checkpoint, about 30 s here, and the run's note shows its progress"
    return [
        f"  1. DAGs -> kappa_reprocess -> Trigger: pipeline {pipeline}, rules version v2, a reason -> Trigger",
        "  2. watch the run: wait_ready's log shows the lag and ETA, validation_report what v2 changes; the run "
        "promotes v2 when it is ready. With auto-promote off, its promote task ends skipped and the run's note "
        "links to kappa_promote, which promotes v2 when you trigger it",
        f"     either promote ends its run at the flip: v2 serves, and {standby}",
        f"  3. DAGs -> kappa_rollback -> Trigger: pipeline {pipeline}, a reason -> {back}",
    ]


def run_up(opts: UpOptions, *, console: Console | None = None, overrides: dict[str, Any] | None = None,
           stop: threading.Event | None = None, on_ready: Callable[[Up], None] | None = None) -> int:
    """Bring everything up, wait for Ctrl-C/SIGTERM (or `stop`), stop everything. Returns 0, or 1 if
    something was left running."""
    console = console or Console(highlight=False)
    up = Up(opts, console, overrides)
    stop = stop or threading.Event()
    in_main = threading.current_thread() is threading.main_thread()

    def on_signal(signum, frame):
        up.stopped_by(signum)
        stop.set()

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
    left = False
    try:
        up.run()
        if not stop.is_set():
            up.show_ready()
            if on_ready is not None:
                on_ready(up)
        while not stop.wait(1.0):
            reap_children()  # jobs this process started and Airflow stopped: no zombies left behind
            if up.stack is not None and not all(up.stack.alive().values()):
                gone = [c for c, alive in up.stack.alive().items() if not alive]
                up.end_reason = f"kappa up stopped: Airflow's {', '.join(gone)} stopped"
                console.print(f"[red]Airflow's {', '.join(gone)} stopped; see {up.stack.log_dir}. "
                              f"Stopping everything.[/]")
                break
    finally:
        for sig in old:
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not skip the cleanup
        try:
            up.section("Stopping everything kappa up started")
            stopped = up.cleanup()
            left = report_stopped(console, stopped, up.earlier_jobs())
            if up.home is not None:
                console.print(f"the registry and tables stay in {up.home}: kappa --home {up.home} history",
                              highlight=False)
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
    return 1 if left else 0
