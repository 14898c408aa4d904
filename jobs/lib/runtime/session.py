"""Spark session and process environment shared by every job, the tests and the benchmark."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

from jobs.lib.runtime.jvm import find_java17, kappa_jar, register
from orchestrator.core.envvars import (KAPPA_SHUFFLE_PARTITIONS, KAPPA_SPARK_DRIVER_MEMORY, KAPPA_SPARK_EVENT_LOG_DIR,
                                     KAPPA_SPARK_JIT, KAPPA_SPARK_LOG_LEVEL, KAPPA_SPARK_MASTER)

__all__ = ["spark_env", "leave_to_c1", "worker_spark_home", "prepare_environment", "default_shuffle_partitions",
           "cds_archive_path", "driver_java_options", "JVM_TIME_ZONE", "runs_tasks", "create_cds_archive", "prune_cache", "connector_jars", "DELTA_CONF", "REDACTION",
           "build_session", "session_settings"]


ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: Spark's redaction patterns (conf values, and the options of a query's plan) widened to the Kafka
#: client's ``sasl.jaas.config``, which carries the SASL password (`jobs.lib.runtime.stream`).
REDACTION = {
    "spark.redaction.regex": r"(?i)secret|password|token|access[.]?key|jaas",
    "spark.sql.redaction.options.regex": r"(?i)url|secret|password|token|jaas",
}
#: delta-spark in every session: its SQL (MERGE, OPTIMIZE, VACUUM, DESCRIBE HISTORY) and its catalog,
#: new tables with deletion vectors (a MERGE marks rows instead of rewriting files), and the Delta log
#: replayed in a few tasks (Spark's default of 50 costs a second per read of a small table here).
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.properties.defaults.enableDeletionVectors": "true",
    "spark.databricks.delta.snapshotPartitions": "2",
}
#: The JIT of a driver JVM that only plans (a cluster's driver, the control plane's short checks):
#: C1 only, since C2's compile threads compete with start-up for the cores (with the CDS archive, 1.9 s
#: less start-up on 2 cores). C1 alone gets a code cache of 48 MB, which a live job filled within a few
#: dozen micro-batches (each MERGE plan is new generated code): the sweeper then evicted and C1
#: recompiled without end, and a 150-record micro-batch took 15 s. The code cache is therefore
#: reserved at the size the full JIT has.
PLANNING_JIT = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
#: A driver that runs the tasks too (``local[N]``: a version's job, a benchmark, the tests' session)
#: keeps the full tiered JIT: there the executors live in the driver's JVM, and C2 halves the CPU of
#: the per-record work (the parse of 2M profiles: 41 -> 17 s of executor CPU). Its compile thresholds
#: are five times the JVM's: Spark generates new classes for every plan (each live MERGE's too), most
#: of them run for one batch, and C2 compiled them all, 17 CPU-s of a 2M-record reprocess's 62; with
#: the higher thresholds C2 compiles what stays hot (10 CPU-s; the executors' CPU unchanged), and a
#: live job's processes use 48 instead of 60 CPU-s over `kappa bench freshness`. Once a job's batches
#: are small (live), `leave_to_c1` leaves C2 out of what its JVM compiles from then on.
TASK_JIT = "-XX:CompileThresholdScaling=5"
#: Every kappa JVM runs in UTC, whatever the machine's zone (the SQL session's zone is UTC already):
#: delta-spark checks a table's whole file list against its checksum after every commit when the JVM's
#: default zone is not UTC (`allFilesInCrc.verificationMode.forceOnNonUTC`), a second replay of the
#: table's log: one more Spark job and about 0.4 s per live MERGE on 2 cores.
JVM_TIME_ZONE = "-Duser.timezone=UTC"


def runs_tasks(master: str) -> bool:
    """Whether a driver of `master` runs the tasks in its own JVM (a local master)."""
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster")


#: The JVMs (by their py4j gateway: one per driver process) whose JIT `leave_to_c1` settled. Kept here, not
#: as a mark on the gateway: py4j's `JavaGateway.__getattr__` sends unknown names to the JVM, so any mark would read true.
_SETTLED: set[int] = set()


def leave_to_c1(spark: Any) -> str | None:
    """Leave every method compiled from now on to C1 in the JVM of `spark`, whose tasks have become
    small (a job's live micro-batches): a HotSpot compiler directive (`jobs/lib/source/jvm/Jit.java`),
    added once per JVM. Only a local master's JVM with the full JIT (`TASK_JIT`) is changed: a
    cluster's executors are other JVMs, and a C1-only JVM has no C2 to leave out. C2 has done its work
    by then: the backfill's per-record code, compiled while the backfill ran, stays compiled.

    `kappa bench freshness` (20 updates/s, trigger 1 s, 2026-11-30): with C2 all along, a live job's
    compile threads took 38.7 of its JVM's 91.9 CPU-s; with C2 through the backfill and C1 after it
    (this) 20.1 of 71.8. Alternated twice in one hour, without and with this: the job's processes 66.3
    and 64.4 CPU-s over the live updates without, 50.3 and 53.2 with; p50 12.5 and 11.8 s without, 9.4
    and 13.1 s with (the latency is within the machine's noise; the CPU is not).

    Returns what was done, in words, or None when nothing was (already done, another master or JIT, or
    the JVM refused: a JIT is a matter of speed, never of a batch's fate)."""
    sc = spark.sparkContext
    if id(sc._gateway) in _SETTLED:
        return None
    _SETTLED.add(id(sc._gateway))
    if not runs_tasks(sc.master) or PLANNING_JIT.split()[0] in (sc.getConf().get("spark.driver.extraJavaOptions") or ""):
        return None
    try:
        answer = str(sc._jvm.kappa.jvm.Jit.leaveToC1()).strip()
    except Exception as e:   # noqa: BLE001 - a JVM without HotSpot's diagnostic commands: it keeps its JIT
        return f"the JVM kept its JIT: {str(e).splitlines()[0][:200]}"
    return f"C2 left out of the JIT from now on (HotSpot: {answer})"


def spark_env() -> dict[str, str]:
    """Environment a Spark driver (and its Python workers) needs on these machines."""
    env = {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYARROW_IGNORE_TIMEZONE": "1",
    }
    java = find_java17()
    if java:
        env["JAVA_HOME"] = java
    return env


def _install_id() -> str:
    """A short id of this pyspark installation's folder: each venv gets its own mirror and archive (an
    archive is only valid for the classpath it was made with, and a mirror links to one venv's jars)."""
    import hashlib

    import pyspark

    return hashlib.sha256(str(Path(pyspark.__file__).resolve().parent).encode()).hexdigest()[:10]


def worker_spark_home() -> str | None:
    """A SPARK_HOME for the pip-installed pyspark whose Python workers import the installed pyspark.

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the PYTHONPATH of every Python
    process it starts (the data source planners, the streaming source runner, the workers). The
    zip holds sources only, so each of them compiles pyspark anew: about 1 s of CPU per process,
    several of them before a query's first trigger. This mirror of the package's directory, made
    once under the cache, lacks ``python/``; the processes then import the installed, byte-compiled
    pyspark. None (Spark's own SPARK_HOME stays) when there is no such zip or no writable cache.
    """
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "python" / "lib" / "pyspark.zip").is_file():
        return None
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    mirror = cache / "kappa" / f"spark-home-{pyspark.__version__}-{_install_id()}"
    if (mirror / "jars").exists():
        return str(mirror)
    try:
        mirror.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=mirror.name + ".", dir=mirror.parent))
        for entry in home.iterdir():
            if entry.name != "python":
                (tmp / entry.name).symlink_to(entry)
        try:
            tmp.rename(mirror)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        return None
    return str(mirror) if (mirror / "jars").exists() else None


def prepare_environment() -> None:
    """Point Spark at Java 17 and this interpreter before the JVM starts (another JDK is present),
    and at `worker_spark_home` unless SPARK_HOME is set."""
    forced = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "JAVA_HOME")
    for k, v in spark_env().items():
        if k in forced:
            os.environ[k] = v
        else:
            os.environ.setdefault(k, v)
    if not os.environ.get("SPARK_HOME"):
        home = worker_spark_home()
        if home:
            os.environ["SPARK_HOME"] = home


@contextlib.contextmanager
def session_settings(spark: Any, settings: dict[str, str | None]) -> Iterator[None]:
    """Set Spark SQL settings on `spark` (a session) for the block, then put each back as it was
    (unset if it was not set). A value of None leaves that setting alone but restores it after the
    block, for a block that may set it itself."""
    conf = spark.conf
    before = {k: conf.get(k, None) for k in settings}
    for k, v in settings.items():
        if v is not None:
            conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                conf.unset(k)
            else:
                conf.set(k, v)


def default_shuffle_partitions(master: str) -> int:
    """The session's ``spark.sql.shuffle.partitions`` when the caller gives none:
    KAPPA_SHUFFLE_PARTITIONS, else the cores of a local master (``local[N]``, ``local[*]``), else 2.

    Spark's own default (200) would give a stateful query 200 state stores per operator. A seed
    job's pipeline sets its own number (`jobs.lib.runtime.seedjob.state_partitions`).
    """
    raw = os.environ.get(KAPPA_SHUFFLE_PARTITIONS, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            from orchestrator.core.exceptions import ConfigError

            raise ConfigError(f"{KAPPA_SHUFFLE_PARTITIONS} must be a positive integer, got {raw!r}")
        return int(raw)
    m = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?", master.strip())
    if m:
        cores = m.group(1)
        return (os.cpu_count() or 2) if cores == "*" else int(cores or 1)
    return 2


def connector_jars() -> list[str]:
    """The JARs of Spark's Kafka connector and delta-spark, fetched from Maven Central by
    `deploy/dev.sh setup` (`orchestrator.core.jars`), pruned of what pyspark ships, and kappa's own JVM
    functions (`jobs.lib.runtime.jvm`, compiled once); JarsError, one line naming the setup, when they
    were never fetched. They go to ``spark.jars``, which also ships them to a standalone cluster's
    executors."""
    from orchestrator.core.jars import require_jars

    return sorted(str(p) for p in require_jars("spark").glob("*.jar")) + [str(kappa_jar())]


def cds_archive_path() -> Path:
    """Where the driver JVM's class-data-sharing archive lives: one per Spark version, JDK and set
    of connector JARs (an archive of another classpath is only ignored by the JVM, never an error,
    but it saves nothing, so a new one is made)."""
    import pyspark

    from orchestrator.core.jars import jar_dir

    java = Path(find_java17() or "java").resolve().name
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kappa" / f"spark-{pyspark.__version__}-{_install_id()}-{java}-{jar_dir('spark').name}.jsa"


#: KAPPA_SPARK_JIT's values: the JIT of a driver that runs the tasks.
JIT_MODES = {"full": TASK_JIT, "quick": PLANNING_JIT}


def task_jit() -> str:
    """The JIT of a driver that runs the tasks: KAPPA_SPARK_JIT `full` (the default: C2 pays for itself over
    a backfill) or `quick` (C1 only: a run over a few thousand records, where C2's compile threads cost more
    CPU than they save, as in the test suite)."""
    mode = (os.environ.get(KAPPA_SPARK_JIT) or "full").strip().lower()
    if mode not in JIT_MODES:
        raise ValueError(f"{KAPPA_SPARK_JIT}={mode!r} is not a JIT mode: set it to full or quick, or unset it")
    return JIT_MODES[mode]


def driver_java_options(extra: str = "", *, tasks: bool = False) -> str:
    """The driver JVM's options: its JIT (`task_jit()` when it runs the `tasks` too, else `PLANNING_JIT`),
    its time zone (`JVM_TIME_ZONE`), and the class-data-sharing archive when one was made
    (`create_cds_archive`); `extra` (the caller's own spark.driver.extraJavaOptions) last."""
    opts = [task_jit() if tasks else PLANNING_JIT, JVM_TIME_ZONE]
    archive = cds_archive_path()
    if archive.is_file() and "ArchiveClassesAtExit" not in extra:
        # -Xlog:cds=off: an archive of another classpath or JDK build is skipped without a warning
        opts += [f"-XX:SharedArchiveFile={archive}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
    return " ".join(o for o in opts + [extra] if o)


def prune_cache(folder: Path) -> list[Path]:
    """Delete, in kappa's cache `folder`, the SPARK_HOME mirrors (`worker_spark_home`) whose pyspark
    installation is gone (their ``jars`` link leads nowhere: the venv was deleted) and the class-data-sharing
    archives of those installations (about 190 MB each: every fresh clone's venv made one, and nothing
    deleted them). What an installation still present uses is kept. Returns what was deleted."""
    gone: list[Path] = []
    for mirror in sorted(folder.glob("spark-home-*")):
        if not mirror.is_dir() or mirror.is_symlink() or not (mirror / "jars").is_symlink() or (mirror / "jars").exists():
            continue
        version_id = mirror.name[len("spark-home-"):]          # <pyspark version>-<install id>
        for archive in folder.glob(f"spark-{version_id}-*.jsa"):
            try:
                archive.unlink(missing_ok=True)
            except OSError:       # not ours to delete: kept, and the archive just made stays usable
                continue
            gone.append(archive)
        shutil.rmtree(mirror, ignore_errors=True)
        if not mirror.exists():
            gone.append(mirror)
    return gone


def create_cds_archive(force: bool = False, timeout: float = 300.0) -> Path | None:
    """Make the class-data-sharing archive of the driver JVM once (about 20 s): a short session in a
    child process whose JVM dumps the classes it loaded at exit. Every later `build_session` maps
    them instead of loading them from the jars (about 1.5 s less start-up). None if it failed."""
    import subprocess

    archive = cds_archive_path()
    if archive.is_file() and not force:
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=archive.name + ".", suffix=".tmp", dir=archive.parent)
    os.close(fd)
    os.unlink(tmp)  # the JVM creates it
    code = ("import sys; from jobs.lib.runtime.session import build_session as b; "
            "s = b('kappa-cds', extra={'spark.driver.extraJavaOptions': sys.argv[1]}); "
            "jvm = s.sparkContext._gateway.proc; "
            "s.range(1000).selectExpr('id % 7 AS k').groupBy('k').count().collect(); "
            "p = sys.argv[2]; s.range(10).write.format('delta').save(p); "
            "s.sql(f'MERGE INTO delta.`{p}` t USING (SELECT 3L id) u ON t.id = u.id WHEN MATCHED THEN DELETE'); "
            "s.read.format('delta').load(p).count(); s.stop(); "
            "jvm.stdin.close(); jvm.wait(120)")  # the JVM writes the archive as it exits
    opts = f"-XX:ArchiveClassesAtExit={tmp} -Xlog:cds=off -Xlog:cds+dynamic=off"
    env = {**os.environ, **spark_env()}
    scratch = tempfile.mkdtemp(prefix="kappa-cds-")
    try:
        subprocess.run([sys.executable, "-c", code, opts, str(Path(scratch) / "t")], env=env, timeout=timeout,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not Path(tmp).is_file():
            return None
        os.replace(tmp, archive)  # atomic: a concurrent start sees the old archive or the new one
        prune_cache(archive.parent)
        return archive
    except (subprocess.SubprocessError, OSError):
        return None
    finally:
        Path(tmp).unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)


def build_session(app_name: str = "kappa", master: str | None = None, local_dir: str | None = None,
                  shuffle_partitions: int | None = None, extra: dict[str, str] | None = None, *,
                  short_lived: bool = False):
    """A SparkSession with Spark's Kafka connector and delta-spark (`connector_jars`, `DELTA_CONF`) and
    the RocksDB state store on.

    Runs on the driver. `master` defaults to KAPPA_SPARK_MASTER or local[2]; `shuffle_partitions`
    to `default_shuffle_partitions`. A local master's JVM runs the tasks with the full JIT, unless the
    session is `short_lived` (a check of the control plane: fast start-up first).
    """
    prepare_environment()
    jars = connector_jars()   # before the JVM starts: missing JARs are one line, not a ClassNotFound
    from pyspark.sql import SparkSession

    master = master or os.environ.get(KAPPA_SPARK_MASTER, "local[2]")
    if shuffle_partitions is None:
        shuffle_partitions = default_shuffle_partitions(master)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")   # logs get the job's lines, not progress bars
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        # kappa sizes its shuffles itself (a few partitions), so adaptive execution has nothing to coalesce;
        # it would only run every shuffle stage as a job of its own (a live MERGE: 15 jobs instead of 10)
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.driver.memory", os.environ.get(KAPPA_SPARK_DRIVER_MEMORY, "2g"))
        .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(sys.path))
    )
    if local_dir:
        builder = builder.config("spark.local.dir", local_dir)
    events = os.environ.get(KAPPA_SPARK_EVENT_LOG_DIR)
    if events:   # a benchmark reads the job's executor CPU from it (`jobs.lib.runtime.sparkwork`)
        Path(events).mkdir(parents=True, exist_ok=True)
        builder = (builder.config("spark.eventLog.enabled", "true").config("spark.eventLog.dir", Path(events).as_uri())
                   .config("spark.eventLog.compress", "false"))   # Spark 4 compresses with zstd by default
    extra = dict(extra or {})
    own_jars = [j for j in str(extra.pop("spark.jars", "")).split(",") if j]
    builder = builder.config("spark.jars", ",".join(jars + own_jars))
    for k, v in {**DELTA_CONF, **REDACTION}.items():
        builder = builder.config(k, v)
    builder = builder.config("spark.driver.extraJavaOptions",
                             driver_java_options(extra.pop("spark.driver.extraJavaOptions", ""),
                                                 tasks=runs_tasks(master) and not short_lived))
    for k, v in extra.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get(KAPPA_SPARK_LOG_LEVEL, "WARN"))
    register(spark)
    return spark
