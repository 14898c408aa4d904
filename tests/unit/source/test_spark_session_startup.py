"""What `jobs.lib.runtime.session` does to shorten a Spark job's start-up: a SPARK_HOME whose Python processes
import the installed pyspark (not the source-only pyspark.zip), and the driver JVM's options (C1, and
the class-data-sharing archive only once it exists)."""

from __future__ import annotations

import os
from pathlib import Path

import pyspark
import pytest

from jobs.lib.runtime import session
from orchestrator.core.envvars import KAPPA_SPARK_JIT


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_worker_spark_home_mirrors_pyspark_without_its_python_dir(cache):
    home = session.worker_spark_home()
    real = Path(pyspark.__file__).parent
    assert home is not None and Path(home).parent == cache / "kappa"
    names = {p.name for p in Path(home).iterdir()}
    assert "python" not in names and {"jars", "bin"} <= names
    assert (real / "python" / "lib" / "pyspark.zip").is_file()   # what the mirror leaves out
    assert (Path(home) / "jars").resolve() == (real / "jars").resolve()
    assert session.worker_spark_home() == home                     # made once, then reused
    assert session._install_id() in Path(home).name                 # one mirror per venv


def test_prepare_environment_keeps_a_spark_home_that_is_set(cache, monkeypatch):
    monkeypatch.setenv("SPARK_HOME", "/opt/my-spark")
    session.prepare_environment()
    assert os.environ["SPARK_HOME"] == "/opt/my-spark"


def test_driver_options_use_the_archive_only_once_it_exists(cache):
    archive = session.cds_archive_path()
    assert archive.parent == cache / "kappa" and session._install_id() in archive.name
    plain = f"{session.PLANNING_JIT} {session.JVM_TIME_ZONE}"
    assert session.driver_java_options() == plain
    assert session.driver_java_options("-Dmine=1") == f"{plain} -Dmine=1"
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(b"jsa")
    opts = session.driver_java_options("-Dmine=1").split()
    assert " ".join(opts[:3]) == plain and opts[-1] == "-Dmine=1"     # the caller's own options last
    assert f"-XX:SharedArchiveFile={archive}" in opts and "-Xlog:cds=off" in opts
    # making an archive: the dump option is not combined with using one
    assert "-XX:SharedArchiveFile" not in session.driver_java_options(f"-XX:ArchiveClassesAtExit={archive}.new")


def test_a_session_without_the_connector_jars_is_one_line_naming_the_setup(cache):
    """Spark's Kafka connector and delta-spark are fetched by the setup; without them no JVM starts."""
    from orchestrator.core.jars import JarsError

    with pytest.raises(JarsError) as err:
        session.build_session("kappa-no-jars")
    message = str(err.value)
    assert "\n" not in message and "deploy/dev.sh setup" in message
    assert "Spark's Kafka connector and delta-spark" in message and str(cache) in message


def test_the_archive_is_made_per_set_of_connector_jars(cache):
    """An archive of another classpath saves nothing: a changed pom (new JAR folder) gets its own."""
    from orchestrator.core.jars import jar_dir

    assert session.cds_archive_path().name.endswith(f"-{jar_dir('spark').name}.jsa")


def test_a_driver_that_runs_the_tasks_keeps_the_full_jit_and_a_planning_driver_compiles_with_c1(cache, monkeypatch):
    """In local[N] the executors live in the driver's JVM: C1 only doubled the parse's CPU there."""
    monkeypatch.delenv(KAPPA_SPARK_JIT, raising=False)   # the suite's own jobs run quick (tests/conftest.py)
    assert session.runs_tasks("local[2]") and session.runs_tasks("local") and not session.runs_tasks("spark://h:7077")
    assert "TieredStopAtLevel" not in session.driver_java_options(tasks=True)
    # C2 on, for what stays hot: the classes Spark generates for one batch's plan are left to C1
    assert "-XX:CompileThresholdScaling=5" in session.driver_java_options(tasks=True).split()
    assert "CompileThresholdScaling" not in session.driver_java_options(tasks=False)
    seen = {}

    class Builder:
        def __getattr__(self, name):
            return lambda *a: (seen.__setitem__(a[0], a[1]) if name == "config" and len(a) == 2 else None) or self

        def getOrCreate(self):
            raise RuntimeError("stop here")

    import pyspark.sql

    monkeypatch.setattr(session, "connector_jars", lambda: [])
    monkeypatch.setattr(pyspark.sql.SparkSession, "builder", Builder())
    for master, short, c1 in (("local[2]", False, False), ("local[1]", True, True), ("spark://127.0.0.1:7077", False, True)):
        with pytest.raises(RuntimeError, match="stop here"):
            session.build_session("x", master=master, short_lived=short)
        assert ("-XX:TieredStopAtLevel=1" in seen["spark.driver.extraJavaOptions"]) is c1, (master, short)


def test_a_quick_jit_stops_a_task_driver_at_c1_and_an_unknown_mode_is_one_line(cache, monkeypatch):
    monkeypatch.setenv(KAPPA_SPARK_JIT, "quick")
    assert session.driver_java_options(tasks=True).startswith(session.PLANNING_JIT)
    monkeypatch.setenv(KAPPA_SPARK_JIT, "Full ")
    assert "TieredStopAtLevel" not in session.driver_java_options(tasks=True)
    monkeypatch.setenv(KAPPA_SPARK_JIT, "fast")
    with pytest.raises(ValueError) as err:
        session.driver_java_options(tasks=True)
    assert str(err.value) == "KAPPA_SPARK_JIT='fast' is not a JIT mode: set it to full or quick, or unset it"


def test_a_c1_only_driver_keeps_the_full_jit_s_code_cache(cache):
    """C1 alone sizes the code cache at 48 MB; a live job's new MERGE plans filled it within a few
    dozen micro-batches, and the sweeper and C1 then took the cores (15 s for 150 records)."""
    opts = session.driver_java_options().split()
    assert "-XX:TieredStopAtLevel=1" in opts
    sizes = [o.split("=", 1)[1] for o in opts if o.startswith("-XX:ReservedCodeCacheSize=")]
    assert len(sizes) == 1 and sizes[0].endswith("m") and int(sizes[0][:-1]) >= 240


def test_every_driver_runs_in_utc_whatever_the_machine_s_zone(cache, monkeypatch):
    """The SQL session's zone is UTC; the JVM's own is set too, for delta-spark's commits
    (tests/integration/source/test_session_time_zone.py shows what a JVM in another zone costs)."""
    for mode in ("full", "quick"):
        monkeypatch.setenv(KAPPA_SPARK_JIT, mode)
        for tasks in (True, False):
            assert "-Duser.timezone=UTC" in session.driver_java_options(tasks=tasks).split(), (mode, tasks)


def test_the_cache_drops_what_a_deleted_venv_left_and_keeps_what_a_present_one_uses(cache, tmp_path):
    """Each fresh clone's venv made a 190 MB archive and a mirror under ~/.cache/kappa, and nothing
    deleted them once the venv was gone."""
    folder = cache / "kappa"
    home = Path(session.worker_spark_home())                       # this venv's mirror: kept
    mine = folder / f"spark-{pyspark.__version__}-{session._install_id()}-java-17-x-spark-1.jsa"
    mine.write_bytes(b"archive")
    venv = tmp_path / "gone-venv" / "pyspark"                      # another venv's mirror and archives
    (venv / "jars").mkdir(parents=True)
    dead = folder / "spark-home-4.1.0-deadbeef00"
    dead.mkdir()
    (dead / "jars").symlink_to(venv / "jars")
    (dead / "bin").symlink_to(venv / "bin")
    theirs = [folder / "spark-4.1.0-deadbeef00-java-17-x-spark-1.jsa", folder / "spark-4.1.0-deadbeef00-java-17-x-spark-2.jsa"]
    for a in theirs:
        a.write_bytes(b"archive")
    jars = folder / "jars"                                         # the Maven JARs: never touched
    jars.mkdir()
    assert session.prune_cache(folder) == []                       # that venv is still there
    (venv / "jars").rmdir()                                        # ... and now deleted
    assert sorted(session.prune_cache(folder)) == sorted([*theirs, dead])
    assert not dead.exists() and not any(a.exists() for a in theirs)
    assert home.is_dir() and mine.is_file() and jars.is_dir()


class _Jit:
    """`sc._jvm.kappa.jvm.Jit` of a stand-in JVM: answers like HotSpot, or refuses like a JVM without its
    diagnostic commands."""

    def __init__(self, refuse: str | None):
        self.refuse, self.calls = refuse, 0

    def leaveToC1(self) -> str:   # noqa: N802 - the Java method's name
        self.calls += 1
        if self.refuse:
            raise RuntimeError(self.refuse)
        return "1 compiler directives added\n"


@pytest.fixture(autouse=True)
def _no_jvm_settled(monkeypatch):
    """`leave_to_c1` remembers the JVMs it settled by their gateway's id: a stand-in's id can be reused."""
    monkeypatch.setattr(session, "_SETTLED", set())


def _spark(master: str, java_options: str, refuse: str | None = None):
    """A stand-in SparkSession with what `leave_to_c1` reads: its context's master, driver options, gateway, JVM."""
    from types import SimpleNamespace

    jit = _Jit(refuse)
    sc = SimpleNamespace(master=master, _gateway=object(),
                         getConf=lambda: {"spark.driver.extraJavaOptions": java_options},
                         _jvm=SimpleNamespace(kappa=SimpleNamespace(jvm=SimpleNamespace(Jit=jit))))
    return SimpleNamespace(sparkContext=sc), jit


def test_leave_to_c1_changes_a_full_jit_local_jvm_once_and_says_so():
    spark, jit = _spark("local[2]", session.TASK_JIT)
    assert session.leave_to_c1(spark) == "C2 left out of the JIT from now on (HotSpot: 1 compiler directives added)"
    assert session.leave_to_c1(spark) is None          # once per JVM: the directive stays for its life
    assert jit.calls == 1


def test_leave_to_c1_leaves_a_cluster_driver_and_a_c1_only_jvm_alone():
    cluster, on_cluster = _spark("spark://127.0.0.1:7077", session.TASK_JIT)   # its executors are other JVMs
    quick, c1_only = _spark("local[2]", session.PLANNING_JIT)                   # no C2 to leave out
    assert (session.leave_to_c1(cluster), session.leave_to_c1(quick)) == (None, None)
    assert (on_cluster.calls, c1_only.calls) == (0, 0)


def test_a_jvm_that_refuses_the_directive_keeps_its_jit_and_says_why_in_one_line():
    spark, jit = _spark("local[2]", session.TASK_JIT,
                        refuse="javax.management.InstanceNotFoundException: com.sun.management:type=DiagnosticCommand\n"
                               "\tat java.management/...")
    said = session.leave_to_c1(spark)
    assert said == ("the JVM kept its JIT: javax.management.InstanceNotFoundException: "
                    "com.sun.management:type=DiagnosticCommand")
    assert session.leave_to_c1(spark) is None and jit.calls == 1   # not asked again every batch
