"""kappa's JVM: the Java 17 that runs Spark, and kappa's own JVM functions, compiled once, on every
session's classpath, registered by name.

The sources are Java files beside the code that calls them (`jobs/lib/source/jvm/*.java`: the JSON
reading of `jobs.lib.source.json_values`). `kappa_jar` compiles them with the JDK's ``javac``
(``--release 17``, against pyspark's own JARs) into one JAR in the cache,
``~/.cache/kappa/jvm/kappa-jvm-<hash>.jar``, keyed by the sources, the pyspark version and the JDK, so
a changed source gets a new JAR and a cache never serves a stale one. `deploy/dev.sh setup` compiles it
(``python -m jobs.lib.runtime.jvm``); a session compiles it itself if the setup did not (about
2 s, once). `jobs.lib.runtime.session.connector_jars` puts it on ``spark.jars`` (the driver, and a
standalone cluster's executors), and `register` names its functions in a session.

The JAR also holds the helper of `jobs.lib.runtime.session.leave_to_c1` (`jobs/lib/source/jvm/Jit.java`):
a job's JVM that serves small live micro-batches turns C2 off for what it compiles from then on.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

__all__ = ["JAVA17_CANDIDATES", "find_java17", "JSON_FIELDS", "JSON_FIELDS_DDL", "SOURCES", "kappa_jar", "register"]

JAVA17_CANDIDATES = (
    "/usr/lib/jvm/java-17-openjdk-amd64",
    "/usr/lib/jvm/java-17-openjdk-arm64",
    "/usr/lib/jvm/java-17-openjdk",
    "/usr/lib/jvm/openjdk-17",
)

#: The JSON reading (`jobs/lib/source/jvm/JsonFields.java`): ``kappa_json_fields(value, "a,b,c")``.
JSON_FIELDS = "kappa_json_fields"
#: What it returns: per named field (in the order given), its JSON type and its text.
JSON_FIELDS_DDL = "struct<t: array<string>, v: array<string>>"
#: Each function: (its SQL name, its class, its return type).
_FUNCTIONS = [(JSON_FIELDS, "kappa.jvm.JsonFields", JSON_FIELDS_DDL)]
SOURCES = Path(__file__).resolve().parent.parent / "source" / "jvm"
_REGISTERED = "_kappa_jvm_functions"


def find_java17() -> str | None:
    """JAVA_HOME for Spark: the environment's if it is a Java 17, else a known install path."""
    home = os.environ.get("JAVA_HOME")
    if home and "17" in Path(home).resolve().name:
        return home
    for cand in JAVA17_CANDIDATES:
        if Path(cand, "bin", "java").exists():
            return cand
    return home


def _sources() -> list[Path]:
    return sorted(SOURCES.glob("*.java"))


def _javac() -> Path:
    from orchestrator.core.jars import JarsError

    home = find_java17()
    javac = Path(home or "/nonexistent", "bin", "javac")
    if not javac.is_file():
        raise JarsError(f"kappa's JVM functions need a JDK's javac to compile, and {javac} is missing: install a "
                        f"JDK 17 (apt-get install openjdk-17-jdk-headless) or set JAVA_HOME to one")
    return javac


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def jar_path() -> Path:
    """Where the JAR of the current sources, pyspark and JDK is (or will be)."""
    import pyspark

    digest = hashlib.sha256()
    for src in _sources():
        digest.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    # the JDK by its home, not by its javac: a machine whose JAR is cached runs without javac
    digest.update(pyspark.__version__.encode() + b"\0" + str(Path(find_java17() or "/nonexistent").resolve()).encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kappa" / "jvm"
    return cache / f"kappa-jvm-{digest.hexdigest()[:12]}.jar"


def kappa_jar() -> Path:
    """The JAR of kappa's JVM functions, compiled now if it is not in the cache (see the module); JarsError,
    one line, when it cannot be (no ``javac``, or a source that does not compile)."""
    from orchestrator.core.jars import JarsError

    jar = jar_path()
    if jar.is_file():
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".kappa-jvm-", dir=jar.parent) as tmp:
        classes = Path(tmp) / "classes"
        cmd = [str(_javac()), "--release", "17", "-nowarn", "-Xlint:none", "-encoding", "UTF-8",
               "-cp", str(_pyspark_jars() / "*"), "-d", str(classes), *map(str, _sources())]
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if "error" in ln]
            raise JarsError(f"kappa's JVM functions do not compile ({SOURCES}): "
                            f"{lines[0] if lines else f'javac exited {done.returncode}'}")
        part = Path(tmp) / jar.name
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: kappa\r\n\r\n")
            for f in sorted(classes.rglob("*.class")):
                z.write(f, f.relative_to(classes).as_posix())
        os.replace(part, jar)   # atomic: a concurrent compile of the same sources writes the same JAR
    return jar


def register(spark: Any) -> None:
    """Name kappa's JVM functions in `spark` (once per session); ConfigError, one line, when the session
    was built without their JAR."""
    if getattr(spark, _REGISTERED, False):
        return
    from orchestrator.core.exceptions import ConfigError

    for name, cls, ddl in _FUNCTIONS:
        try:
            spark.udf.registerJavaFunction(name, cls, ddl)
        except Exception as e:   # Spark's "Can not load class": a session kappa did not build
            if "load class" not in str(e) and "ClassNotFound" not in str(e):
                raise
            raise ConfigError(f"this Spark session cannot load kappa's JVM functions ({cls}): build it with "
                              f"jobs.lib.runtime.session.build_session, which puts {jar_path().name} on "
                              f"spark.jars") from None
    setattr(spark, _REGISTERED, True)


if __name__ == "__main__":   # the setup (deploy/dev.sh): compile once, say so, or one line why not
    from orchestrator.core.jars import JarsError

    try:
        if not jar_path().is_file():
            print(f"==> compiling kappa's JVM functions (once): {kappa_jar()}", file=sys.stderr)
    except JarsError as e:
        sys.exit(f"error: {e}")
