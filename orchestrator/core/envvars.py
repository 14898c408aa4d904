"""Every KAPPA_* environment variable kappa reads, named once, here.

Code reads a variable through its constant (`os.environ.get(KAPPA_SPARK_MASTER)`), never through a
literal name; `kappa --help` lists the whole catalogue (`CATALOGUE`), and a unit test
(tests/unit/layout/test_envvars_catalogue.py) fails when a `KAPPA_` name in orchestrator/, jobs/ or
dags/ is not catalogued here or is spelled out where a constant should be used.

The settings' variables (`SETTINGS_VARS`, in the order of `Settings`' fields) are resolved by
`orchestrator.core.settings.resolve_settings`: CLI flag > environment variable > config file >
default; empty variables count as unset. The others are read where they are used.

Standard library only: the jobs import it in their Spark driver.
"""

from __future__ import annotations

from typing import Final, NamedTuple

__all__ = ["CATALOGUE", "EnvVar", "SETTINGS_VARS",
           "KAPPA_AIRFLOW_DB_URL", "KAPPA_AIRFLOW_KAFKA_CONN_ID", "KAPPA_AIRFLOW_PASSWORD",
           "KAPPA_AIRFLOW_POKE_SECONDS", "KAPPA_AIRFLOW_URL", "KAPPA_AIRFLOW_USER", "KAPPA_BOOTSTRAP_SERVERS",
           "KAPPA_CHECKPOINTS", "KAPPA_CONFIG", "KAPPA_GROUP_PREFIX", "KAPPA_HOME", "KAPPA_JOB_PATH", "KAPPA_KAFKA_CONFIG",
           "KAPPA_LAG_SAMPLE_RETENTION_SECONDS", "KAPPA_LAUNCH_ID", "KAPPA_PIPELINES",
           "KAPPA_READINESS_WINDOW_SECONDS", "KAPPA_REGISTRY_URL", "KAPPA_RULES", "KAPPA_SHUFFLE_PARTITIONS",
           "KAPPA_SPARK_DRIVER_MEMORY", "KAPPA_SPARK_EVENT_LOG_DIR", "KAPPA_SPARK_JIT", "KAPPA_SPARK_LOG_LEVEL", "KAPPA_SPARK_MASTER", "KAPPA_STATE_DIR",
           "KAPPA_WAREHOUSE"]


class EnvVar(NamedTuple):
    """One variable: its name, a one-line description and, for a setting, the field and its default."""

    name: str
    description: str
    setting: str | None = None
    default: str = ""


# -- the settings (orchestrator.core.settings), in the order of Settings' fields ----------------
KAPPA_HOME: Final = "KAPPA_HOME"
KAPPA_WAREHOUSE: Final = "KAPPA_WAREHOUSE"
KAPPA_STATE_DIR: Final = "KAPPA_STATE_DIR"
KAPPA_CHECKPOINTS: Final = "KAPPA_CHECKPOINTS"
KAPPA_REGISTRY_URL: Final = "KAPPA_REGISTRY_URL"
KAPPA_BOOTSTRAP_SERVERS: Final = "KAPPA_BOOTSTRAP_SERVERS"
KAPPA_KAFKA_CONFIG: Final = "KAPPA_KAFKA_CONFIG"
KAPPA_GROUP_PREFIX: Final = "KAPPA_GROUP_PREFIX"
KAPPA_PIPELINES: Final = "KAPPA_PIPELINES"
KAPPA_RULES: Final = "KAPPA_RULES"
KAPPA_JOB_PATH: Final = "KAPPA_JOB_PATH"
KAPPA_SPARK_MASTER: Final = "KAPPA_SPARK_MASTER"
KAPPA_LAG_SAMPLE_RETENTION_SECONDS: Final = "KAPPA_LAG_SAMPLE_RETENTION_SECONDS"
KAPPA_READINESS_WINDOW_SECONDS: Final = "KAPPA_READINESS_WINDOW_SECONDS"
#: Not a setting itself: where the settings' config file is.
KAPPA_CONFIG: Final = "KAPPA_CONFIG"

# -- Airflow ---------------------------------------------------------------------------------------
KAPPA_AIRFLOW_URL: Final = "KAPPA_AIRFLOW_URL"
KAPPA_AIRFLOW_USER: Final = "KAPPA_AIRFLOW_USER"
KAPPA_AIRFLOW_PASSWORD: Final = "KAPPA_AIRFLOW_PASSWORD"
KAPPA_AIRFLOW_DB_URL: Final = "KAPPA_AIRFLOW_DB_URL"
KAPPA_AIRFLOW_POKE_SECONDS: Final = "KAPPA_AIRFLOW_POKE_SECONDS"
KAPPA_AIRFLOW_KAFKA_CONN_ID: Final = "KAPPA_AIRFLOW_KAFKA_CONN_ID"

# -- the jobs' Spark driver ------------------------------------------------------------------------
KAPPA_SHUFFLE_PARTITIONS: Final = "KAPPA_SHUFFLE_PARTITIONS"
KAPPA_SPARK_DRIVER_MEMORY: Final = "KAPPA_SPARK_DRIVER_MEMORY"
KAPPA_SPARK_LOG_LEVEL: Final = "KAPPA_SPARK_LOG_LEVEL"
KAPPA_SPARK_EVENT_LOG_DIR: Final = "KAPPA_SPARK_EVENT_LOG_DIR"
KAPPA_SPARK_JIT: Final = "KAPPA_SPARK_JIT"

# -- internal --------------------------------------------------------------------------------------
KAPPA_LAUNCH_ID: Final = "KAPPA_LAUNCH_ID"

SETTINGS_VARS: tuple[EnvVar, ...] = (
    EnvVar(KAPPA_HOME, "kappa home: the registry, warehouse, state, broker and Airflow files live under it",
           "home", "`<cwd>/.kappa`"),
    EnvVar(KAPPA_WAREHOUSE, "root of the Delta tables: a local path or a URI (file://, s3://, gs://, abfss://, "
           "hdfs://)", "warehouse", "`<home>/warehouse`"),
    EnvVar(KAPPA_STATE_DIR, "the jobs' run directories (local), and their checkpoints unless KAPPA_CHECKPOINTS "
           "is set", "state_dir", "`<home>/state`"),
    EnvVar(KAPPA_CHECKPOINTS, "root of the jobs' Spark checkpoints: a local path or a URI on storage every "
           "executor reaches", "checkpoints", "the state dir"),
    EnvVar(KAPPA_REGISTRY_URL, "registry database: sqlite:///<path> or postgresql://<user>@<host>/<db>",
           "registry_url", "`sqlite:///<home>/registry.db`"),
    EnvVar(KAPPA_BOOTSTRAP_SERVERS, "Kafka bootstrap servers, host:port[,host:port...]", "bootstrap_servers",
           "None (the embedded broker)"),
    EnvVar(KAPPA_KAFKA_CONFIG, "extra librdkafka settings as a JSON object, merged key by key over the "
           "config file's", "kafka_config", "`{}` (JSON object / TOML table)"),
    EnvVar(KAPPA_GROUP_PREFIX, "prefix of the Kafka consumer group ids", "group_prefix", "`kappa`"),
    EnvVar(KAPPA_PIPELINES, "the pipelines file (TOML)", "pipelines_file", "the shipped `pipelines.toml`"),
    EnvVar(KAPPA_RULES, "the rules location: a local folder or file:// URI holding <ruleset>/<version>.toml",
           "rules_location", "the shipped `jobs/rules`"),
    EnvVar(KAPPA_JOB_PATH, "folders the pipelines' job modules are imported from (a team's repository), "
           "separated by ':', before the installed packages", "job_path", "none (kappa's own `jobs`)"),
    EnvVar(KAPPA_SPARK_MASTER, "Spark master the jobs run on", "spark_master", "`local[2]`"),
    EnvVar(KAPPA_LAG_SAMPLE_RETENTION_SECONDS, "lag samples older than this many seconds are deleted",
           "lag_sample_retention_seconds", "`259200` (3 days)"),
    EnvVar(KAPPA_READINESS_WINDOW_SECONDS, "a readiness decision counts only lag samples this many seconds "
           "recent", "readiness_window_seconds", "`300`"),
)

CATALOGUE: dict[str, EnvVar] = {v.name: v for v in (
    *SETTINGS_VARS,
    EnvVar(KAPPA_CONFIG, "the config file (TOML) of the settings; --config wins (default <home>/kappa.toml, "
           "optional)"),
    EnvVar(KAPPA_AIRFLOW_URL, "kappa trigger: Airflow base URL (--airflow-url; default: the running stack's)"),
    EnvVar(KAPPA_AIRFLOW_USER, "kappa trigger: Airflow login (--airflow-user; default admin)"),
    EnvVar(KAPPA_AIRFLOW_PASSWORD, "kappa trigger, kappa airflow start: Airflow password "
           "(--airflow-password, --password; default admin)"),
    EnvVar(KAPPA_AIRFLOW_DB_URL, "kappa airflow start: PostgreSQL URL of Airflow's metadata (--db-url; "
           "default SQLite in <home>/airflow)"),
    EnvVar(KAPPA_AIRFLOW_POKE_SECONDS, "Airflow sensors: seconds between two pokes (default 15, at least 2)"),
    EnvVar(KAPPA_AIRFLOW_KAFKA_CONN_ID, "Airflow tasks: the connection holding Kafka settings "
           "(default kafka_default)"),
    EnvVar(KAPPA_SHUFFLE_PARTITIONS, "jobs: spark.sql.shuffle.partitions (default: a local master's cores, "
           "else 2)"),
    EnvVar(KAPPA_SPARK_DRIVER_MEMORY, "jobs and bench: Spark driver memory (default 2g)"),
    EnvVar(KAPPA_SPARK_LOG_LEVEL, "jobs and bench: Spark log level (default WARN)"),
    EnvVar(KAPPA_SPARK_JIT, "jobs: `full` (default) keeps the JVM's whole JIT in a driver that runs the tasks (C2 for code that stays hot); "
           "`quick` stops at C1 there too (short runs over little data, such as the test suite's jobs)"),
    EnvVar(KAPPA_SPARK_EVENT_LOG_DIR, "jobs: write Spark's event log into this folder (the benchmarks read "
           "executor CPU seconds from it; default: none)"),
    EnvVar(KAPPA_LAUNCH_ID, "internal: set by kappa in a job's environment to find its processes; "
           "do not set"),
)}
