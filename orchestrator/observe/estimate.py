"""Before a reprocess starts: how big the log is, how long the backfill should take, on how many cores.

`estimate_backfill(k, spec)` is what `kappa deploy --dry-run`, a deploy (stored in the new version's
`details["estimate"]`, in the transaction that allocates it), the reprocess DAG's run note and its
trigger form show:

- **the log**: per source topic, its records from the log offsets (ListOffsets earliest and latest of
  every partition; the sum of end - start, an upper bound on a compacted topic, whose cleaned offsets
  are gaps) and its bytes: the partitions' segment sizes from Kafka's own `LogDirsCommand` (the tool of
  `kafka-log-dirs.sh --describe`, from the fetched Kafka JARs; the client settings in a 0600
  `--command-config` file, never on its command line), or, when that tool cannot run, records x the
  average key and value size of a few records sampled per partition, labelled as sampled;
- **the rate**: the newest earlier version of the same pipeline whose backfill was measured
  (`details["backfill"]`: its planned offsets, the batch's seconds, the start-up before it, its cores),
  scaled to the cores the new version gets; without one, a default per job kind, said so;
- **the cores**: `local[N]` -> N, `local[*]` -> this machine's; a cluster's are not known to kappa. A
  deploy (and its dry run) also samples, for a second, the CPU the pipeline's running jobs use on this
  host (`busy_cores`: the serving version's live micro-batches come first), and counts only the cores
  left free; a rate measured with other jobs busy beside it is scaled from the cores that were free then.

The estimate is start-up + records / rate. It never raises for a broker it cannot reach: it is then
`known=False` with the reason, and a deploy goes on as before.

After the backfill, readiness records the measured actual once (`backfill_actual`, when the job's status
first shows its backfill batch written): records, offsets, the batch's seconds, the
seconds from the job's start to the batch written, the end offsets and the bytes the estimate saw. That
actual is what the next version's rate comes from, and `compare` puts it beside the estimate (the goal:
within 25 % once one earlier version was measured).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import tempfile
import time
import uuid
from typing import TYPE_CHECKING, Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.exceptions import BrokerError, KappaError
from orchestrator.observe import lag
from orchestrator.observe.lag import KAFKA_TIMEOUT, fmt_seconds, kafka_error

if TYPE_CHECKING:
    from orchestrator.context import Kappa
    from orchestrator.core.pipelines import PipelineSpec
    from orchestrator.core.settings import Settings

__all__ = ["BackfillEstimate", "TopicSize", "BytesMode", "DEFAULT_RATES", "DEFAULT_STARTUP_SECONDS", "GOAL_RATIO",
           "ESTIMATE_TIMEOUT",
           "estimate_backfill", "cores_of", "default_rate", "measured_rate", "log_dir_bytes", "sampled_bytes",
           "backfill_actual", "compare", "compare_text", "fmt_bytes"]

log = logging.getLogger(__name__)

#: Records per second per core of a backfill with no earlier version measured, by job kind (kappa's job
#: module, or "team" for a team's job). standardize: `kappa bench reprocess` and `bench deploy` (2026-11-28,
#: 58,000-100,000 records/s on 2 cores); the seed jobs' stateful operators are slower, pageview_enrich's
#: Python state the slowest. A first guess, said so wherever it is shown.
DEFAULT_RATES: dict[str, float] = {"standardize": 25_000.0, "pageviews_hourly": 10_000.0,
                                   "profile_settings_join": 10_000.0, "ad_click_join": 10_000.0,
                                   "pageview_enrich": 2_000.0, "team": 10_000.0}
#: Seconds from a job's start to its first batch under way (Spark start-up, query start), by default.
DEFAULT_STARTUP_SECONDS = 8.0
#: The estimate is good when the actual is within this share of it either way.
GOAL_RATIO = 0.25
#: Seconds the estimate waits for each answer of the broker (the log offsets), by default.
ESTIMATE_TIMEOUT = KAFKA_TIMEOUT
#: A rate measured on a log more than this many times smaller or larger than the one now is called extrapolated.
EXTRAPOLATED = 2.0
#: Records sampled per partition for the sampled size.
SAMPLE_RECORDS = 5
#: Seconds over which a deploy samples the CPU the pipeline's running jobs use on this host (the cores a
#: new backfill will not get: the serving version's live micro-batches take theirs first).
BUSY_SAMPLE_SECONDS = 1.0
#: A backfill is estimated on at least this many free cores, however busy the machine.
MIN_FREE_CORES = 0.25
LOG_DIRS_CLASS = "org.apache.kafka.tools.LogDirsCommand"

BytesMode = Literal["log-dirs", "sample", "none"]


class TopicSize(BaseModel):
    model_config = ConfigDict(frozen=True)

    topic: str
    partitions: int
    records: int                 # sum of log end - log start: an upper bound on a compacted topic
    bytes: int | None = None


class BackfillEstimate(BaseModel):
    """What a backfill of `pipeline` from offset zero should take, as estimated at `at`."""

    model_config = ConfigDict(frozen=True)

    pipeline: str
    at: float
    known: bool
    reason: str | None = None                 # why the estimate is unknown
    topics: list[TopicSize] = Field(default_factory=list)
    records: int | None = None
    bytes: int | None = None
    bytes_source: str | None = None           # "log-dirs", "sampled", or None (not measured)
    bytes_note: str | None = None             # why bytes were sampled or not measured
    cores: int | None = None
    cores_source: str = ""
    #: cores the pipeline's running jobs used on this host when the estimate was made (None: not sampled)
    busy_cores: float | None = None
    busy_source: str | None = None
    rate: float | None = None                 # records/s on the cores free of `busy_cores`
    startup_seconds: float | None = None
    rate_source: str = ""
    from_version: int | None = None           # the earlier version the rate was measured on
    seconds: float | None = None

    def summary(self) -> str:
        """One line: 'estimate 45 s for 2,000,000 records (at most; compacted) / 400.1 MB on 2 cores at 52,000
        records/s (v3's backfill)' or 'estimate unknown: <reason>'."""
        if not self.known:
            return f"estimate unknown: {self.reason}"
        size = f"{self.records:,} records (an upper bound on a compacted topic)"
        if self.bytes is not None:
            size += f", {fmt_bytes(self.bytes)}" + (" (sampled)" if self.bytes_source == "sampled" else "")
        cores = f"{self.cores} cores" if self.cores else "the cluster's cores (unknown to kappa)"
        if self.cores and self.busy_cores:
            cores += f" ({free_cores(self.cores, self.busy_cores):.1f} free: {self.busy_source})"
        return (f"backfill estimate {fmt_seconds(self.seconds)}: {size} at {self.rate:,.0f} records/s on {cores} "
                f"+ {self.startup_seconds:.0f} s start-up ({self.rate_source})")

    def lines(self) -> list[str]:
        """The summary, then one line per topic and what bytes were measured with."""
        out = [self.summary()]
        for t in self.topics:
            b = "" if t.bytes is None else f", {fmt_bytes(t.bytes)}"
            out.append(f"  topic {t.topic}: {t.partitions} partitions, {t.records:,} records{b}")
        if self.known and self.bytes_note:
            out.append(f"  bytes: {self.bytes_note}")
        return out


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


# -- cores and rates ---------------------------------------------------------------------------------

_LOCAL = re.compile(r"^local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$")


def cores_of(settings: Settings) -> tuple[int | None, str]:
    """(cores, where from) of the jobs this kappa starts: local[N] -> N, local[*] -> this machine's, a
    cluster's -> (None, why)."""
    master = settings.spark_master.strip()
    m = _LOCAL.match(master)
    if m is None:
        return None, f"spark_master {master}: the cluster's cores are not known to kappa"
    n = m.group(1)
    if n is None:
        return 1, f"spark_master {master}"
    if n == "*":
        return os.cpu_count() or 1, f"spark_master {master} (this machine's cores)"
    return int(n), f"spark_master {master}"


def job_kind(spec: PipelineSpec) -> str:
    """kappa's job module name (`standardize`), or "team" for a team's own job."""
    from orchestrator.core.jobref import OWN_PACKAGE, parse_job_ref

    try:
        module = parse_job_ref(spec.job)[0]
    except KappaError:
        return "team"
    parts = module.split(".")
    return parts[-1] if parts[0] == OWN_PACKAGE and parts[-1] in DEFAULT_RATES else "team"


def default_rate(spec: PipelineSpec, cores: int | None, busy: float | None = None) -> tuple[float, float, str]:
    """(records/s, start-up seconds, where from) for a pipeline none of whose versions was measured."""
    kind = job_kind(spec)
    per_core = DEFAULT_RATES[kind]
    return (per_core * (free_cores(cores, busy) if cores else 1), DEFAULT_STARTUP_SECONDS,
            f"default for {'a team job' if kind == 'team' else kind} ({per_core:,.0f} records/s a core), "
            f"no earlier version measured")


def free_cores(cores: int, busy: float | None) -> float:
    """The cores a new backfill gets beside running jobs that used `busy` cores when sampled: the kernel splits
    the cores evenly between processes that want them all (a backfill starts at full share), so a running job
    keeps what it used up to half of them, and the backfill has the rest (at least `MIN_FREE_CORES`)."""
    return max(MIN_FREE_CORES, cores - min(busy or 0.0, cores / 2))


def measured_rate(records: Iterable[Any], cores: int | None, busy: float | None = None
                  ) -> tuple[float, float, str, int] | None:
    """(records/s on the cores free now, start-up seconds, where from, version) from the newest version among
    `records` (the pipeline's `VersionRecord`s) whose backfill was measured; None when none was. A rate measured
    on other free cores (more cores, or other jobs busy beside it then) is scaled to the free cores now."""
    for rec in sorted(records, key=lambda r: r.version, reverse=True):
        b = (rec.details or {}).get("backfill")
        if not isinstance(b, dict):
            continue
        amount = b.get("offsets") or b.get("records")
        batch = float(b.get("batch_seconds") or 0.0)
        if not amount or batch <= 0:
            continue
        rate = float(amount) / batch
        then = b.get("cores")
        where = f"measured on v{rec.version}'s backfill: {int(amount):,} records in {batch:.1f} s"
        if cores and then:
            free_then, free_now = free_cores(int(then), b.get("busy_cores")), free_cores(cores, busy)
            if abs(free_then - free_now) > 0.05:
                rate *= free_now / free_then
                where += f", scaled from {round(free_then, 1):g} to {round(free_now, 1):g} free cores"
        startup = max(0.0, float(b.get("seconds") or batch) - batch)
        return rate, startup, where, rec.version
    return None


def _measured_amount(records: Iterable[Any], version: int | None) -> int | None:
    for rec in records:
        if rec.version == version:
            b = (rec.details or {}).get("backfill") or {}
            return b.get("offsets") or b.get("records")
    return None


def running_cores(records: Iterable[Any], seconds: float | None = None) -> tuple[float | None, str | None]:
    """(cores used now by the jobs of the running versions among `records`, on this host, sampled over
    `seconds` (`BUSY_SAMPLE_SECONDS`); which versions): None when none runs here."""
    import psutil

    seconds = BUSY_SAMPLE_SECONDS if seconds is None else seconds

    from orchestrator.core.states import RUNNING

    procs, names = [], []
    for rec in records:
        if rec.pid and rec.state in RUNNING:
            try:
                root = psutil.Process(rec.pid)
                procs += [root, *root.children(recursive=True)]
                names.append(f"v{rec.version}")
            except psutil.Error:
                continue
    if not procs:
        return None, None

    def cpu() -> float:
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                continue
        return total

    c0, w0 = cpu(), time.monotonic()
    time.sleep(seconds)
    # One rounding for the figure and its words: 0.9549 once printed "1.0 busy" beside a 0.95 the
    # estimate subtracted.
    used = round(max(0.0, (cpu() - c0) / max(1e-6, time.monotonic() - w0)), 1)
    return used, f"{used:.1f} busy with the job{'s' if len(names) > 1 else ''} of {', '.join(names)}"


# -- the log's size --------------------------------------------------------------------------------

def _java_properties(config: dict[str, Any]) -> str:
    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return "".join(f"{esc(str(k))}={esc(str(v))}\n" for k, v in config.items())


def log_dir_bytes(k: Kappa, topics: Iterable[str], timeout: float = 30.0) -> dict[str, int]:
    """{topic: bytes} of the topics' partitions (each partition's largest replica) from Kafka's own
    LogDirsCommand; BrokerError when the tool cannot run or answer."""
    import json

    from jobs.lib.runtime.jvm import find_java17
    from jobs.lib.runtime.stream import java_kafka_config
    from orchestrator.core.jars import require_jars

    topics = list(topics)
    home = find_java17()
    if not home:
        raise BrokerError("Kafka's LogDirsCommand needs Java 17 (set JAVA_HOME)")
    cp = str(require_jars("kafka") / "*")
    conf = {k2: v for k2, v in java_kafka_config(k.settings.kafka_client_config()).items()
            if k2 != "bootstrap.servers"}
    fd, props = tempfile.mkstemp(prefix="kappa-logdirs-", suffix=".properties")   # 0600: it may hold secrets
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_java_properties(conf))
        cmd = [os.path.join(home, "bin", "java"), "-XX:TieredStopAtLevel=1", "-Xmx256m", "-Dlog4j2.level=error",
               "-cp", cp, LOG_DIRS_CLASS, "--bootstrap-server", k.bootstrap_servers, "--describe",
               "--topic-list", ",".join(topics), "--command-config", props]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise BrokerError(f"Kafka's LogDirsCommand did not answer within {timeout:.0f} s") from None
    finally:
        os.unlink(props)
    doc = next((ln for ln in done.stdout.splitlines() if ln.startswith("{")), None)
    if done.returncode != 0 or doc is None:
        lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        raise BrokerError(f"Kafka's LogDirsCommand failed: {lines[-1] if lines else done.returncode}")
    return parse_log_dirs(json.loads(doc), topics)


def parse_log_dirs(doc: dict[str, Any], topics: Iterable[str]) -> dict[str, int]:
    """{topic: bytes} from LogDirsCommand's JSON: per partition the largest replica, summed per topic."""
    wanted = set(topics)
    sizes: dict[tuple[str, int], int] = {}
    for broker in doc.get("brokers") or []:
        for d in broker.get("logDirs") or []:
            for p in d.get("partitions") or []:
                if p.get("isFuture"):
                    continue
                topic, _, n = str(p.get("partition", "")).rpartition("-")
                if topic in wanted and n.isdigit():
                    sizes[(topic, int(n))] = max(sizes.get((topic, int(n)), 0), int(p.get("size") or 0))
    out = {t: 0 for t in wanted}
    for (topic, _), size in sizes.items():
        out[topic] += size
    return out


def sampled_bytes(k: Kappa, logs: dict[tuple[str, int], tuple[int, int]], per_partition: int = SAMPLE_RECORDS,
                  timeout: float = 5.0) -> dict[str, int]:
    """{topic: records x the average key and value size of up to `per_partition` records read from the start
    of each partition}; BrokerError when nothing could be read."""
    from confluent_kafka import Consumer, TopicPartition

    live = {tp: se for tp, se in logs.items() if se[1] > se[0]}
    if not live:
        return {t: 0 for t, _ in logs}
    consumer = Consumer({**k.kafka_config(), "group.id": f"kappa-estimate-{uuid.uuid4().hex[:12]}",
                         "enable.auto.commit": False, "enable.partition.eof": True},
                        logger=logging.getLogger("kappa.kafka"))
    seen: dict[tuple[str, int], list[int]] = {tp: [] for tp in live}
    done: set[tuple[str, int]] = set()
    try:
        consumer.assign([TopicPartition(t, p, s) for (t, p), (s, _) in live.items()])
        deadline = time.monotonic() + timeout
        while len(done) < len(live) and time.monotonic() < deadline:
            for msg in consumer.consume(100, timeout=0.5):
                tp = (msg.topic(), msg.partition())
                if tp not in seen:
                    continue
                if msg.error() is not None:   # the partition's end (enable.partition.eof) or an error: done with it
                    done.add(tp)
                    continue
                if len(seen[tp]) < per_partition:
                    seen[tp].append(len(msg.key() or b"") + len(msg.value() or b""))
                if len(seen[tp]) >= per_partition:
                    done.add(tp)
    except Exception as e:
        raise kafka_error("sample records", k, e) from None
    finally:
        consumer.close()
    sizes = [s for v in seen.values() for s in v]
    if not sizes:
        raise BrokerError(f"no record could be sampled within {timeout:.0f} s")
    avg = sum(sizes) / len(sizes)
    out: dict[str, int] = {}
    for (t, _), (s, e) in logs.items():
        out[t] = out.get(t, 0) + int((e - s) * avg)
    return out


# -- the estimate --------------------------------------------------------------------------------------

def estimate_backfill(k: Kappa, spec: PipelineSpec, *, bytes_mode: BytesMode = "log-dirs",
                      timeout: float | None = None, history: Iterable[Any] | None = None,
                      busy: bool = False) -> BackfillEstimate:
    """The estimate of a backfill of `spec` from offset zero now (see the module). `history`: the
    pipeline's version records, if read already (else read here); `timeout`: seconds for each answer of the
    broker (`ESTIMATE_TIMEOUT`). Never raises for a broker or registry it cannot read: the estimate is then
    unknown, with the reason. `busy`: sample the CPU the pipeline's running jobs use on this host now
    (`busy_cores`, over `BUSY_SAMPLE_SECONDS`), which the new backfill will not get."""
    now = time.time()
    timeout = ESTIMATE_TIMEOUT if timeout is None else timeout
    cores, cores_source = cores_of(k.settings)
    try:
        logs = lag.log_offsets(k, spec.topics, timeout)
    except KappaError as e:
        return BackfillEstimate(pipeline=spec.name, at=now, known=False, reason=str(e), cores=cores,
                                cores_source=cores_source)
    per_topic: dict[str, list[int]] = {t: [0, 0] for t in spec.topics}
    for (t, _), (s, e) in logs.items():
        per_topic[t][0] += 1
        per_topic[t][1] += max(0, e - s)
    sizes, bytes_source, note = _topic_bytes(k, spec.topics, logs, bytes_mode, timeout)
    topics = [TopicSize(topic=t, partitions=n, records=r, bytes=None if sizes is None else sizes.get(t))
              for t, (n, r) in per_topic.items()]
    records = sum(t.records for t in topics)
    try:
        recs = list(history) if history is not None else k.registry.list_versions(spec.name)
    except KappaError as e:
        recs, note = [], ((note + "; ") if note else "") + f"no history read ({e})"
    busy_now, busy_source = (running_cores(recs) if busy and cores else (None, None))
    measured = measured_rate(recs, cores, busy_now)
    if measured is not None:
        rate, startup, where, from_version = measured
        then = _measured_amount(recs, from_version)
        if then and records and max(records / then, then / records) > EXTRAPOLATED:
            # a batch's fixed costs weigh more in a small backfill: a rate taken from one far smaller or larger
            # log is extrapolated, and said so
            where += f"; extrapolated from a log {records / then:.1f}x this size" if records < then else \
                f"; extrapolated to a log {records / then:.1f}x that size"
    else:
        (rate, startup, where), from_version = default_rate(spec, cores, busy_now), None
    return BackfillEstimate(
        pipeline=spec.name, at=now, known=True, topics=topics, records=records,
        bytes=None if sizes is None else sum(sizes.values()), bytes_source=bytes_source, bytes_note=note,
        cores=cores, cores_source=cores_source, busy_cores=busy_now, busy_source=busy_source, rate=rate, startup_seconds=startup, rate_source=where,
        from_version=from_version, seconds=startup + records / rate)


def _topic_bytes(k: Kappa, topics: Iterable[str], logs: dict[tuple[str, int], tuple[int, int]], mode: BytesMode,
                 timeout: float) -> tuple[dict[str, int] | None, str | None, str | None]:
    """(bytes per topic, source, note): LogDirsCommand, else sampled, else not measured (the note says why)."""
    if mode == "none":
        return None, None, "not measured here"
    why = None
    if mode == "log-dirs":
        try:
            return log_dir_bytes(k, topics, timeout=max(timeout, 30.0)), "log-dirs", "the partitions' segment sizes"
        except KappaError as e:
            why = str(e)
    try:
        sampled = sampled_bytes(k, logs, timeout=min(timeout, 5.0))
    except KappaError as e:
        return None, None, f"not measured ({why + '; ' if why else ''}sampling failed: {e})"
    note = f"records x the average size of {SAMPLE_RECORDS} records sampled per partition"
    return sampled, "sampled", note + (f" (LogDirsCommand: {why})" if why else "")


# -- the actual, after the backfill -----------------------------------------------------------------------

def backfill_actual(measure: dict[str, Any], *, started_at: float | None, cores: int | None,
                    estimate: dict[str, Any] | None) -> dict[str, Any]:
    """`details["backfill"]` from the job's status `backfill` (`jobs.lib.runtime.context`): records, offsets,
    the batch's seconds, the seconds from the job's start to the batch written, end offsets, cores, and
    the bytes the version's estimate saw (the log at deploy)."""
    batch = float(measure.get("seconds") or 0.0)
    committed = measure.get("committed_at")
    total = (float(committed) - started_at) if committed is not None and started_at is not None else None
    return {"batch_id": measure.get("batch_id"), "records": measure.get("records"), "offsets": measure.get("offsets"),
            "bytes": (estimate or {}).get("bytes"), "batch_seconds": round(batch, 3),
            "seconds": None if total is None else round(max(total, batch), 3), "committed_at": committed,
            "end_offsets": measure.get("end_offsets"), "cores": cores,
            "busy_cores": (estimate or {}).get("busy_cores")}


def compare(estimate: dict[str, Any] | None, actual: dict[str, Any] | None) -> dict[str, Any] | None:
    """{"estimate_seconds", "actual_seconds", "ratio" (actual / estimate), "within_goal"} of a version that has
    both a known estimate and a measured backfill; None otherwise."""
    if not isinstance(estimate, dict) or not isinstance(actual, dict):
        return None
    est, act = estimate.get("seconds"), actual.get("seconds")
    if not estimate.get("known") or not est or act is None:
        return None
    ratio = float(act) / float(est)
    return {"estimate_seconds": float(est), "actual_seconds": float(act), "ratio": round(ratio, 3),
            "within_goal": abs(ratio - 1.0) <= GOAL_RATIO, "rate_source": estimate.get("rate_source")}


def compare_text(details: dict[str, Any] | None) -> str | None:
    """'backfill: estimate 45 s, actual 41 s (0.91 of the estimate, within 25 %)' for a version's details; the
    estimate alone while the backfill runs; None without an estimate."""
    details = details or {}
    est, act = details.get("estimate"), details.get("backfill")
    if not isinstance(est, dict):
        return None
    c = compare(est, act)
    if c is not None:
        verdict = "within" if c["within_goal"] else "outside"
        return (f"backfill: estimate {fmt_seconds(c['estimate_seconds'])}, actual {fmt_seconds(c['actual_seconds'])} "
                f"({c['ratio']:.2f} of the estimate, {verdict} {GOAL_RATIO:.0%}; {c['rate_source']})")
    if not est.get("known"):
        return f"backfill: estimate unknown ({est.get('reason')})"
    actual = "" if not isinstance(act, dict) else f", actual {fmt_seconds(act.get('seconds'))}"
    return f"backfill: estimate {fmt_seconds(est.get('seconds'))}{actual} ({est.get('rate_source')})"
