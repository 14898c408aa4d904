"""JARs from Maven Central: the embedded Apache Kafka broker's and Spark's connectors.

Each classpath is a Maven project under `deploy/jars/<name>/pom.xml` that only pins coordinates.
`deploy/dev.sh setup` (through `python -m orchestrator.core.jars fetch`) runs
`mvn dependency:copy-dependencies` once per pom into `~/.cache/kappa/jars/<name>-<hash of the pom>/`;
a changed pom gets a new folder, so a cache never holds a stale mix. `mvn` is the client that
reaches the registry on these machines: no Ivy, no `spark.jars.packages`.

The `spark` set is pruned of every JAR whose artifact pyspark already ships in `pyspark/jars`
(hadoop, jackson, parquet, slf4j, log4j, scala, ...), so Spark's classpath holds one copy of each
library, pyspark's. The `kafka` set is the broker's own JVM classpath and is kept whole.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestrator.core.exceptions import ConfigError
from orchestrator.core.resources import jars_pom

__all__ = ["JAR_SETS", "JarsError", "artifact_of", "fetch_jars", "jar_dir", "require_jars"]

#: What each set is for, as said in errors.
JAR_SETS = {"kafka": "the embedded Apache Kafka broker and Kafka's tools",
            "spark": "Spark's Kafka connector and delta-spark"}
COMPLETE = ".kappa-complete"
_VERSION = re.compile(r"-\d[^-]*(?:-[A-Za-z0-9.]+)*\.jar$")


class JarsError(ConfigError):
    """A set of JARs is missing or cannot be fetched."""


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kappa" / "jars"


def jar_dir(name: str) -> Path:
    """Where the set `name` is (or will be) cached: keyed by the pom's content."""
    pom = jars_pom(name)
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    return _cache_root() / f"{name}-{digest}"


def require_jars(name: str) -> Path:
    """The folder of the fetched set `name`; JarsError, one line, if it was never fetched."""
    folder = jar_dir(name)
    if not (folder / COMPLETE).is_file():
        raise JarsError(f"the JARs of {JAR_SETS[name]} are missing ({folder} was never fetched): "
                        f"run `deploy/dev.sh setup` (it fetches them from Maven Central with mvn)")
    return folder


def artifact_of(jar: str) -> str:
    """`jackson-core-2.21.2.jar` -> `jackson-core`; `spark-tags_2.13-4.2.0.jar` -> `spark-tags_2.13`."""
    return _VERSION.sub("", jar)


def _pyspark_artifacts() -> set[str]:
    import pyspark

    return {artifact_of(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}


def fetch_jars(name: str, *, out=sys.stderr) -> tuple[Path, bool]:
    """Fetch the set `name` once; returns (folder, fetched now). Concurrent fetches each write a
    temporary folder and the first rename wins."""
    folder = jar_dir(name)
    if (folder / COMPLETE).is_file():
        return folder, False
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError(f"fetching {JAR_SETS[name]} needs Maven: install it (apt-get install maven)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))
    try:
        cmd = [mvn, "-q", "-B", "-f", str(jars_pom(name)), "dependency:copy-dependencies",
               "-DincludeScope=runtime", f"-DoutputDirectory={tmp}"]
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            lines = [ln for ln in (done.stdout + done.stderr).splitlines() if "[ERROR]" in ln]
            first = lines[0].replace("[ERROR]", "").strip() if lines else f"mvn exited {done.returncode}"
            raise JarsError(f"cannot fetch {JAR_SETS[name]} from Maven Central: {first}")
        dropped = []
        if name == "spark":
            shipped = _pyspark_artifacts()
            for jar in sorted(tmp.glob("*.jar")):
                if artifact_of(jar.name) in shipped:
                    dropped.append(jar.name)
                    jar.unlink()
        kept = sorted(p.name for p in tmp.glob("*.jar"))
        (tmp / COMPLETE).write_text("\n".join(kept) + "\n")
        print(f"    {name}: {len(kept)} JARs in {folder}"
              + (f" ({len(dropped)} dropped that pyspark ships)" if dropped else ""), file=out)
        try:
            tmp.rename(folder)
        except OSError:  # another fetch finished first
            if not (folder / COMPLETE).is_file():
                raise
        return folder, True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> int:
    if argv[:1] != ["fetch"]:
        print("usage: python -m orchestrator.core.jars fetch [kafka|spark ...]", file=sys.stderr)
        return 2
    try:
        for name in argv[1:] or list(JAR_SETS):
            fetch_jars(name)
    except JarsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
