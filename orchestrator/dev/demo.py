"""`kappa demo`: the whole Kappa reprocessing story on the embedded stack, from nothing.

It starts an embedded broker, creates the compacted `member_profiles` topic, fills it with a
changelog of member profiles and keeps a live producer of updates and deletes running; deploys
v1 of the standardize pipeline with the v1 rules and promotes it once it has caught up; then,
while updates keep arriving, deploys v2 with the v2 rules (which fix and merge several title
spellings), shows its lag going down, prints the validation report, promotes it, shows served
rows before and after, rolls back to v1 and forward to v2 again, and writes the catch-up plot.

Everything printed is read from the running system: the registry, the jobs' status, the Delta
tables through the published alias. Everything it starts (broker, producer, jobs) it stops by
PID at the end, also on Ctrl-C, SIGTERM or an error, and it checks that none is left.

The demo ignores KAPPA_* environment variables and the config file: it starts from nothing in
its own home, with its own broker and a SQLite registry there. Of the global flags given to
`kappa`, `--home`, `--spark-master` and `--pipelines-file` apply.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from orchestrator.core.exceptions import ConfigError
from orchestrator.dev.demo_stop import report_stopped

__all__ = ["DemoOptions", "Demo", "run_demo"]

PIPELINE = "standardize"
ACTOR = "kappa-demo"
SHOW_COLUMNS = ("member_id", "name", "title_raw", "title", "company", "source_offset")


@dataclass
class DemoOptions:
    home: Path | None = None
    records: int = 200_000
    keys: int = 50_000
    rate: float = 50.0
    partitions: int = 4
    threshold: int | None = None      # default: the pipeline's catchup_threshold
    deadline: float = 600.0           # per wait for catch-up
    poll: float = 1.0
    rows: int = 6
    clean: bool = False               # delete the home afterwards (default: keep it to explore)
    seed: int = 7
    value_size: int | None = None     # pad values to about this many bytes (the benchmark)
    malformed_share: float = 0.002
    batch: int | None = 25_000        # records per micro-batch: small, so that lag visibly goes down;
                                      # None: the pipeline's max_records_per_batch (the benchmark)


@dataclass
class Started:
    """Everything the demo started, for the cleanup and the final check."""

    broker: Any = None
    broker_pid: int | None = None
    producer: threading.Thread | None = None
    producer_stop: threading.Event = field(default_factory=threading.Event)
    produced_live: int = 0
    producer_error: str | None = None
    job_pids: dict[int, int] = field(default_factory=dict)    # version -> the pid last known
    earlier_pids: dict[int, list[int]] = field(default_factory=dict)  # version -> pids a restart replaced
    #: the same two, of the other pipelines whose jobs the cleanup stops (`kappa up`: those the UI started)
    others: dict[str, tuple[dict[int, int], dict[int, list[int]]]] = field(default_factory=dict)


class Demo:
    #: Who the registry's audit entries name, and why the jobs stop at the end (`kappa up` has its own).
    actor = ACTOR
    end_reason = "the demo ends"
    pipeline = PIPELINE

    def __init__(self, opts: DemoOptions, console: Console, overrides: dict[str, Any] | None = None,
                 config_file: Path | None = None) -> None:
        self.opts = opts
        self.c = console
        self.overrides = dict(overrides or {})
        self.config_file = config_file
        self.started = Started()
        self.pids_done: set[int] = set()      # job pids the cleanup has stopped or found ended
        self.k = None
        self.home: Path | None = None
        self.temp_home = False
        self.t0 = time.monotonic()
        self.step = 0

    # -- output ---------------------------------------------------------------------------------
    def section(self, title: str) -> None:
        self.step += 1
        text = f"{self.step}. {title}"
        elapsed = f"t+{time.monotonic() - self.t0:.0f}s"
        self.c.print()
        if self.c.is_terminal:
            self.c.rule(f"[bold]{text}[/]  [dim]({elapsed})[/]", align="left")
        else:
            self.c.print(f"── {text}  ({elapsed}) " + "─" * max(4, 96 - len(text) - len(elapsed)), highlight=False)

    def say(self, text: str, **kw) -> None:
        self.c.print(text, highlight=False, **kw)

    # -- setup ----------------------------------------------------------------------------------
    def _make_home(self) -> Path:
        home = self.opts.home or self.overrides.get("home")
        if home is None:
            self.temp_home = True
            return Path(tempfile.mkdtemp(prefix="kappa-demo-"))
        home = Path(home).expanduser().resolve()
        if (home / "registry.db").exists() or (home / "warehouse").exists():
            raise ConfigError(f"the demo starts from nothing, but {home} already holds a kappa home "
                              f"(registry.db or warehouse/); give an empty or new directory with --home, "
                              f"or none for a fresh temporary one")
        home.mkdir(parents=True, exist_ok=True)
        return home

    def _settings(self, bootstrap: str):
        from orchestrator.core.settings import resolve_settings

        keep = {k: v for k, v in self.overrides.items() if k in ("spark_master", "pipelines_file")}
        return resolve_settings(None, env={}, home=str(self.home), bootstrap_servers=bootstrap, **keep)

    # -- the story ------------------------------------------------------------------------------
    def run(self) -> None:
        self.home = self._make_home()
        self.section("The embedded stack")
        self.start_broker()
        self.section("A compacted topic of member profiles, and live updates")
        self.fill_topic()
        self.start_producer()
        self.show_compaction()
        spec = self.k.pipeline(self.pipeline)
        self.alias = spec.alias
        threshold = self.threshold()

        self.section("Deploy v1 with the v1 rules, wait until it has caught up, promote it")
        v1 = self.deploy_and_wait("v1", threshold, "demo: the first version")
        self.promote(v1, "demo: first version goes live")
        self.show_rows(self.sample_ids(v1), "served by alias now")

        self.section("Deploy v2 with the v2 rules while updates keep arriving")
        v2 = self.deploy_and_wait("v2", threshold, "demo: v2 rules keep seniority and merge title spellings")

        self.section("Validation report: what the v2 rules change")
        from orchestrator.lifecycle.report import validation_report

        report = validation_report(self.k.version(self.pipeline, v2), save=True)
        from orchestrator.observe.render import render_report

        render_report(self.c, report.model_dump(mode="json"))

        self.section("Promote v2: served rows before and after")
        ids = self.changed_ids(v1, v2)
        before = self.show_rows(ids, "before the promote")
        self.promote(v2, "demo: v2 rules are better")
        after = self.show_rows(ids, "after the promote", compare=before)

        self.section("Roll back to v1, then forward to v2 again")
        self.rollback(None, "demo: rollback drill")
        back = self.show_rows(ids, "after the rollback", compare=after)
        self.rollback(v2, "demo: roll forward after the drill")
        self.show_rows(ids, "after rolling forward", compare=back)

        self.section("The catch-up curve")
        from orchestrator.observe.lagplot import plot_pipeline_lag

        png = plot_pipeline_lag(self.k.versions(self.pipeline), self.home / "catchup.png")
        self.say(f"wrote {png} ({png.stat().st_size:,} bytes): the lag of v1 and v2 over time")

        self.section("Audit log")
        self.show_history()

    def start_broker(self) -> None:
        from orchestrator.dev.broker import EmbeddedBroker
        from orchestrator.dev.broker_home import write_broker_file

        self.say(f"kappa home: {self.home}" + (" (a fresh temporary directory)" if self.temp_home else ""))
        broker = EmbeddedBroker(self.home / "broker")
        self.started.broker = broker
        broker.start()
        self.started.broker_pid = broker.proc.pid
        write_broker_file(self.home, broker.proc.pid, broker.port, broker.log_path, owner="kappa demo")
        settings = self._settings(broker.bootstrap_servers)
        from orchestrator.context import Kappa

        from orchestrator.core.pipelines import load_pipelines

        pipelines = dict(load_pipelines(settings.pipelines_file))
        if self.opts.batch is not None:
            pipelines[self.pipeline] = pipelines[self.pipeline].model_copy(update={"max_records_per_batch": self.opts.batch})
        self.k = Kappa(settings, pipelines=pipelines)
        self.say(f"embedded broker (Apache Kafka, KRaft, log cleaner on): {broker.bootstrap_servers}, "
                 f"pid {broker.proc.pid}, data in {broker.data_dir}")
        self.say(f"registry: {settings.masked_registry_url}")
        self.say(f"warehouse: {settings.warehouse}")
        batch = self.k.pipeline(self.pipeline).max_records_per_batch
        why = ("small, so that lag visibly goes down; the pipeline's backfill setting is larger"
               if self.opts.batch is not None else "the pipeline's max_records_per_batch")
        self.say(f"Spark master for the jobs: {settings.spark_master}; micro-batches of at most {batch:,} records ({why})")
        self.say(f"[dim]in another terminal: kappa --home {self.home} status --watch[/]")

    def fill_topic(self) -> None:
        from orchestrator.dev.datagen import ensure_topic, generate_changelog, produce

        spec = self.k.pipeline(self.pipeline)
        topic = spec.topics[0]
        bootstrap = self.k.bootstrap_servers
        ensure_topic(bootstrap, topic, self.opts.partitions, compact=True, fast_compaction=True)
        policy = self._cleanup_policy(topic)
        self.say(f"created topic {topic!r}: {self.opts.partitions} partitions, cleanup.policy={policy} "
                 f"(segments close after 1 s, so the cleaner compacts within seconds)")
        stats = produce(bootstrap, topic,
                        generate_changelog(self.opts.records, self.opts.keys, seed=self.opts.seed,
                                           delete_share=0.02, malformed_share=self.opts.malformed_share,
                                           value_size=self.opts.value_size),
                        batching=True, partitions=self.opts.partitions)
        kinds = ", ".join(f"{v:,} {k}" for k, v in sorted(stats.by_kind.items(), key=lambda kv: -kv[1]))
        self.say(f"produced {stats.records:,} records ({stats.bytes / 1e6:.1f} MB) over {self.opts.keys:,} members "
                 f"in {stats.seconds:.1f} s: {kinds}")
        from orchestrator.observe.lag import log_offsets

        ends = log_offsets(self.k, [topic])
        self.say("log end offsets: " + ", ".join(f"{t}:{p}={hi:,}" for (t, p), (_lo, hi) in sorted(ends.items())))

    def show_compaction(self) -> None:
        """How many records the topic holds before and after the cleaner ran: the reprocesses that
        follow read the compacted log from offset zero."""
        from orchestrator.dev.datagen import wait_for_compaction

        from orchestrator.observe.lag import log_offsets

        topic = self.k.pipeline(self.pipeline).topics[0]
        written = sum(hi - lo for lo, hi in log_offsets(self.k, [topic]).values())
        self.say(f"the topic holds {written:,} records so far; waiting for the log cleaner to compact it...")
        after, done = wait_for_compaction(self.k.bootstrap_servers, topic, written, timeout=60)
        if done:
            self.say(f"compacted: {after:,} records readable now, of {written:,} written (live updates keep "
                     f"arriving); superseded values are gone, offsets keep their gaps, and every reprocess "
                     f"reads this log from offset zero")
        else:
            self.say(f"[yellow]the cleaner has not compacted the topic yet ({after:,} records); the demo goes on[/]")

    def _cleanup_policy(self, topic: str) -> str:
        from confluent_kafka.admin import ConfigResource, ResourceType

        fut = self.k.admin().describe_configs([ConfigResource(ResourceType.TOPIC, topic)], request_timeout=10)
        try:
            entry = next(iter(fut.values())).result().get("cleanup.policy")
        except Exception as e:  # the line it feeds only reports the setting: no traceback for it
            return f"unknown ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
        return entry.value if entry is not None else "?"

    def start_producer(self) -> None:
        from orchestrator.dev.datagen import produce_live

        spec = self.k.pipeline(self.pipeline)
        st = self.started

        def progress(n: int) -> None:
            st.produced_live = n

        def body() -> None:
            try:
                st.produced_live = produce_live(self.k.bootstrap_servers, spec.topics[0], rate=self.opts.rate,
                                                stop=st.producer_stop, keys=self.opts.keys, seed=self.opts.seed + 1,
                                                delete_share=0.03, on_progress=progress)
            except Exception as e:  # reported when the demo stops it, never swallowed
                st.producer_error = f"{type(e).__name__}: {e}"

        st.producer = threading.Thread(target=body, name="kappa-demo-producer", daemon=True)
        st.producer.start()
        self.say(f"live producer started (thread in this process): about {self.opts.rate:g} updates and "
                 f"deletes per second of existing members, until the demo ends")

    def threshold(self) -> int:
        spec = self.k.pipeline(self.pipeline)
        t = self.opts.threshold if self.opts.threshold is not None else spec.catchup_threshold
        origin = "--threshold" if self.opts.threshold is not None else "the pipeline's catchup_threshold"
        self.say(f"catch-up rule: lag <= {t:,} records ({origin}; live updates keep arriving) and <= "
                 f"{spec.catchup_seconds:g} s behind (catchup_seconds) in {spec.catchup_samples} samples a "
                 f"micro-batch apart, after a micro-batch committed since the job started, the lag not growing")
        return t

    def deploy_and_wait(self, rules: str, threshold: int, reason: str) -> int:
        from orchestrator.lifecycle.deploy import deploy

        info = deploy(self.k, self.k.pipeline(self.pipeline), rules, actor=self.actor, reason=reason, threshold=threshold)
        if info.pid:
            self.started.job_pids[info.version] = info.pid
        self.say(info.message)
        self.say(f"  rules {info.rules_version} (sha256 {(info.rules_hash or '')[:12]}), table {info.table}")
        self.wait_ready(info.version)
        return info.version

    def wait_ready(self, version: int) -> None:
        from orchestrator.lifecycle.await_ready import wait_ready
        from orchestrator.observe.progress import LagProgress

        t = time.monotonic()
        with LagProgress(self.c, line_every=2.0) as bars:
            r = wait_ready(self.k.version(self.pipeline, version), deadline_seconds=self.opts.deadline,
                           poll_seconds=self.opts.poll, on_sample=bars.update, actor=self.actor)
        self.say(f"v{version} is ready after {time.monotonic() - t:.0f} s: {r.reason} "
                 f"(lag now {r.total_lag:,}; {self.started.produced_live:,} live updates produced so far)")

    def promote(self, version: int, reason: str) -> None:
        """Promote; when the promote's own readiness check finds the version behind again (live updates
        arrive faster than one micro-batch for a moment, so lag crosses the threshold between the wait
        and the flip), say so, wait until it has caught up again and promote then, as an operator would.
        Any other refusal (key count, reject rate) ends the demo with its message."""
        from rich.markup import escape

        from orchestrator.core.exceptions import NotReadyError
        from orchestrator.lifecycle.promote import promote

        deadline = time.monotonic() + self.opts.deadline
        while True:
            try:
                res = promote(self.k.version(self.pipeline, version), actor=self.actor, reason=reason)
                break
            except NotReadyError as e:
                if set(e.failed_checks) != {"ready"} or time.monotonic() >= deadline:
                    raise
                self.say(f"[yellow]the promote was refused: v{version} fell behind again since it was ready "
                         f"({escape(str(e))}); waiting until it has caught up again[/]")
                self.wait_ready(version)
        for check in res.checks:
            self.say(f"  check {check.name}: {'ok' if check.ok else 'FAILED'} - {check.detail}")
        self.say(f"[bold green]{res.message}[/]")
        self.say(f"  pointer {self.k.alias_file(self.alias)} -> {res.pointer.get('table')}")

    def rollback(self, to: int | None, reason: str) -> None:
        from orchestrator.lifecycle.rollback import rollback

        res = rollback(self.k, self.k.pipeline(self.pipeline), to, actor=self.actor, reason=reason, deadline_seconds=self.opts.deadline,
                       poll_seconds=self.opts.poll)
        self.say(f"[bold yellow]{res.message}[/] (waited {res.waited_seconds:.1f} s"
                 + (", restarted from its checkpoint" if res.restarted else ", it was running as standby") + ")")

    # -- rows -----------------------------------------------------------------------------------
    def _table(self, version: int):
        from orchestrator.core.tables import read_table

        return read_table(self.k.paths(self.pipeline, version).table, ["member_id", "title_raw", "title"])

    def sample_ids(self, version: int) -> list[str]:
        t = self._table(version)
        return [str(x) for x in t.column("member_id").slice(0, self.opts.rows).to_pylist()]

    def changed_ids(self, old: int, new: int) -> list[str]:
        """Members whose title the new rules change (same raw title in both tables), one per change."""
        v1, v2 = self._table(old), self._table(new)
        joined = v2.join(v1.rename_columns(["member_id", "title_raw_v1", "title_v1"]), keys="member_id")
        seen, ids = set(), []
        for row in joined.to_pylist():
            if row["title_raw"] != row["title_raw_v1"] or row["title"] == row["title_v1"]:
                continue
            change = (row["title_v1"], row["title"])
            if change in seen:
                continue
            seen.add(change)
            ids.append(row["member_id"])
            if len(ids) >= self.opts.rows:
                break
        return sorted(ids)

    def show_rows(self, ids: list[str], when: str, compare: dict[str, dict] | None = None) -> dict[str, dict]:
        """Read the rows of `ids` through the alias, as any reader would; mark titles that changed."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from orchestrator.core.tables import read_table
        from orchestrator.serving import open_alias, resolve_alias

        pointer = resolve_alias(self.alias, self.k.settings)
        t = read_table(open_alias(self.alias, self.k.settings))
        cols = [c for c in SHOW_COLUMNS if c in t.column_names]
        t = t.filter(pc.is_in(t.column("member_id"), value_set=pa.array(ids, pa.string()))).select(cols)
        rows = {r["member_id"]: r for r in t.to_pylist()}
        table = Table(title=f"alias {self.alias} -> {pointer['pipeline']} v{pointer['version']} ({when})",
                      title_justify="left")
        for col in cols:
            table.add_column(col)
        for mid in ids:
            r = rows.get(mid)
            if r is None:
                table.add_row(mid, "(deleted by a live update)", *[""] * (len(cols) - 2))
                continue
            values = []
            for col in cols:
                v = "" if r.get(col) is None else str(r[col])
                if col == "title" and compare is not None and mid in compare \
                        and compare[mid].get("title") != r.get("title"):
                    v = f"[bold]{v}[/] (was {compare[mid].get('title')})"
                values.append(v)
            table.add_row(*values)
        self.c.print(table)
        return rows

    def show_history(self) -> None:
        from orchestrator.observe.render import fmt_time as _fmt_time

        entries = self.k.registry.audit_log(self.pipeline, limit=40)
        table = Table(title_justify="left", title=f"{len(entries)} audit entries of {self.pipeline} (kappa history)")
        for col in ("at", "action", "version", "outcome", "actor", "reason"):
            table.add_column(col)
        for e in entries:
            table.add_row(_fmt_time(e.at), e.action, "-" if e.version is None else f"v{e.version}", e.outcome,
                          e.actor, e.reason or "")
        self.c.print(table)

    # -- cleanup --------------------------------------------------------------------------------
    def cleanup(self) -> list[tuple[str, int]]:
        """Stop everything the demo started, by PID; return (what, pid) of each.

        `stop_others` (Airflow's components in `kappa up`) starts first and runs while the jobs stop:
        every job is asked to stop (its STOP file) before any is waited for, each then bounded by its
        own timeouts. Once the others are gone, a job one of them started meanwhile is stopped too.
        The broker goes last, once the jobs have committed their checkpoints and stopped.
        """
        from orchestrator.dev.broker_home import broker_file

        stopped: list[tuple[str, int]] = []
        st = self.started
        st.producer_stop.set()
        others = self.stop_others()
        if st.producer is not None:
            st.producer.join(timeout=40)
            if not st.producer.is_alive():
                self.say(f"stopped the live producer thread ({st.produced_live:,} updates and deletes sent"
                         + (f"; it had stopped early: {st.producer_error}" if st.producer_error else "") + ")")
        if self.k is not None:
            stopped += self.stop_jobs()
        stopped = others() + stopped
        if self.k is not None:
            stopped += self.stop_jobs()  # any job started while the others stopped
            self.k.close()
        if st.broker is not None:
            st.broker.stop()
            if st.broker_pid:
                stopped.append(("broker", st.broker_pid))
            if self.home is not None:
                broker_file(self.home).unlink(missing_ok=True)
        return stopped

    def stop_jobs(self) -> list[tuple[str, int]]:
        """Stop the job of every version that runs now, by the PID kappa records now; (what, pid) of each."""
        from orchestrator.dev.demo_stop import stop_version_jobs

        st = self.started
        pids = {self.pipeline: (st.job_pids, st.earlier_pids)}
        pids.update((name, st.others.setdefault(name, ({}, {}))) for name in self.other_pipelines())
        return [stopped for name, (current, earlier) in pids.items()
                for stopped in stop_version_jobs(self.k, name, actor=self.actor, reason=self.end_reason,
                                                 job_pids=current, earlier_pids=earlier, done=self.pids_done,
                                                 say=self.say)]

    def other_pipelines(self) -> list[str]:
        """Pipelines besides the demo's whose jobs the cleanup stops: none, the demo starts no other."""
        return []

    def earlier_jobs(self) -> list[tuple[str, int]]:
        """(what, pid) of the jobs a restart replaced, for the check that nothing is left."""
        st = self.started
        pids = {self.pipeline: st.earlier_pids, **{name: earlier for name, (_, earlier) in st.others.items()}}
        return [(f"{name} v{v} earlier job", pid) for name, earlier in pids.items()
                for v, old in sorted(earlier.items()) for pid in old]

    def stop_others(self) -> Callable[[], list[tuple[str, int]]]:
        """Start stopping what else runs besides the jobs and the broker (nothing in the demo); returns
        the wait for it, called before the broker stops, which gives (what, pid) of each."""
        return list


def run_demo(opts: DemoOptions, *, console: Console | None = None, overrides: dict[str, Any] | None = None,
             config_file: Path | None = None) -> None:
    """Run the demo; stop everything it started whatever happens (Ctrl-C, SIGTERM, an error)."""
    console = console or Console(highlight=False)
    demo = Demo(opts, console, overrides, config_file)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, on_term)
    ok = False
    try:
        demo.run()
        ok = True
    finally:
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip the cleanup
        try:
            demo.section("Stopping everything the demo started" if ok else
                         "Stopping everything the demo started (it did not finish)")
            stopped = demo.cleanup()
            report_stopped(console, stopped, demo.earlier_jobs())
            if demo.started.producer is not None and demo.started.producer.is_alive():
                console.print("[red]the live producer thread did not stop[/]")
            if demo.home is not None:
                if opts.clean:
                    shutil.rmtree(demo.home, ignore_errors=True)
                    console.print(f"deleted the demo home {demo.home}", highlight=False)
                elif ok:
                    console.print(f"the demo's registry, tables and plot stay in {demo.home}; explore them with "
                                  f"`kappa --home {demo.home} history` or `... status`", highlight=False)
            if ok:
                console.print(f"[bold]demo finished in {time.monotonic() - demo.t0:.0f} s[/]")
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
