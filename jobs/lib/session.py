"""Spark session and process environment shared by every job, the tests and the benchmark."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

__all__ = ["find_java17", "spark_env", "prepare_environment", "default_shuffle_partitions", "build_session"]

JAVA17_CANDIDATES = (
    "/usr/lib/jvm/java-17-openjdk-amd64",
    "/usr/lib/jvm/java-17-openjdk-arm64",
    "/usr/lib/jvm/java-17-openjdk",
    "/usr/lib/jvm/openjdk-17",
)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def find_java17() -> str | None:
    """JAVA_HOME for Spark: the environment's if it is a Java 17, else a known install path."""
    home = os.environ.get("JAVA_HOME")
    if home and "17" in Path(home).resolve().name:
        return home
    for cand in JAVA17_CANDIDATES:
        if Path(cand, "bin", "java").exists():
            return cand
    return home


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


def prepare_environment() -> None:
    """Point Spark at Java 17 and this interpreter before the JVM starts (another JDK is present)."""
    forced = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "JAVA_HOME")
    for k, v in spark_env().items():
        if k in forced:
            os.environ[k] = v
        else:
            os.environ.setdefault(k, v)


def default_shuffle_partitions(master: str) -> int:
    """The session's ``spark.sql.shuffle.partitions`` when the caller gives none:
    KAPPA_SHUFFLE_PARTITIONS, else the cores of a local master (``local[N]``, ``local[*]``), else 2.

    Spark's own default (200) would give a stateful query 200 state stores per operator. A seed
    job's pipeline sets its own number (`jobs.lib.seedjob.state_partitions`).
    """
    raw = os.environ.get("KAPPA_SHUFFLE_PARTITIONS", "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            from orchestrator.core.exceptions import ConfigError

            raise ConfigError(f"KAPPA_SHUFFLE_PARTITIONS must be a positive integer, got {raw!r}")
        return int(raw)
    m = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?", master.strip())
    if m:
        cores = m.group(1)
        return (os.cpu_count() or 2) if cores == "*" else int(cores or 1)
    return 2


def build_session(app_name: str = "kappa", master: str | None = None, local_dir: str | None = None,
                  shuffle_partitions: int | None = None, extra: dict[str, str] | None = None):
    """A SparkSession with the Kafka source registered and the RocksDB state store on.

    Runs on the driver. `master` defaults to KAPPA_SPARK_MASTER or local[2]; `shuffle_partitions`
    to `default_shuffle_partitions`.
    """
    prepare_environment()
    from pyspark.sql import SparkSession

    from jobs.lib.kafka import KafkaDataSource

    master = master or os.environ.get("KAPPA_SPARK_MASTER", "local[2]")
    if shuffle_partitions is None:
        shuffle_partitions = default_shuffle_partitions(master)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.driver.memory", os.environ.get("KAPPA_SPARK_DRIVER_MEMORY", "2g"))
        .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(sys.path))
    )
    if local_dir:
        builder = builder.config("spark.local.dir", local_dir)
    for k, v in (extra or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("KAPPA_SPARK_LOG_LEVEL", "WARN"))
    spark.dataSource.register(KafkaDataSource)
    return spark
