#!/usr/bin/env bash
# The README's two commands:
#   deploy/dev.sh demo   set up .venv and the JARs, then run the demo on the embedded stack
#   deploy/dev.sh test   set up .venv and the JARs, start PostgreSQL and install Chromium (Debian) if
#                        missing, build Toxiproxy (Go) into the venv, then run the whole suite
# Java 17 is the only prerequisite. Everything else comes from PyPI, Maven Central and Debian.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
venv="${KAPPA_VENV:-$here/.venv}"

die() { echo "deploy/dev.sh: $*" >&2; exit 1; }

find_java17() {
  if [ -n "${JAVA_HOME:-}" ] && "$JAVA_HOME/bin/java" -version 2>&1 | grep -q 'version "17'; then
    echo "$JAVA_HOME"; return
  fi
  for d in /usr/lib/jvm/java-17-openjdk-amd64 /usr/lib/jvm/java-17-openjdk-arm64 /usr/lib/jvm/java-17-openjdk /usr/lib/jvm/openjdk-17; do
    [ -x "$d/bin/java" ] && { echo "$d"; return; }
  done
  return 1
}

setup_python() {
  local py="${KAPPA_PYTHON:-}"
  if [ -z "$py" ]; then
    for cand in python3.11 python3.12 python3.13 python3; do
      if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        py="$cand"; break
      fi
    done
  fi
  [ -n "$py" ] || die "Python 3.11 or newer is required (set KAPPA_PYTHON to its path)"
  local stamp="$venv/.kappa-installed"
  local want
  want="$(sha256sum pyproject.toml | cut -c1-16)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return
  fi
  echo "==> setting up $venv (PyPI: pyspark, deltalake, confluent-kafka, airflow; takes a few minutes the first time)"
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -e ".[test]"
  echo "$want" > "$stamp"
}

setup_spark_cds() {
  # the Spark driver JVM's class-data-sharing archive (jobs/lib/runtime/session.py): about 20 s once, then
  # every Spark start-up is about 1.5 s shorter; a no-op once the archive exists
  "$venv/bin/python" -c '
from jobs.lib.runtime.session import cds_archive_path, create_cds_archive
if not cds_archive_path().is_file():
    print("==> making the Spark driver class-data-sharing archive (once, about 20 s)", flush=True)
    print("    " + str(create_cds_archive() or "not made: Spark starts without it"))' || true
}

apt_install() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  command -v apt-get >/dev/null || die "install Debian's $* (no apt-get here)"
  if [ -z "${KAPPA_APT_UPDATED:-}" ]; then
    $sudo apt-get update -qq
    KAPPA_APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

setup_maven() {
  command -v mvn >/dev/null && return
  echo "==> installing Debian's maven (it fetches kappa's JARs from Maven Central)"
  apt_install maven
}

setup_jars() {
  # the embedded Apache Kafka broker's JARs and Spark's connectors, pinned in deploy/jars/*/pom.xml,
  # fetched once with mvn into ~/.cache/kappa/jars/<set>-<hash of the pom>/ (orchestrator/core/jars.py)
  setup_maven
  local missing
  missing="$("$venv/bin/python" -c '
from orchestrator.core.jars import JAR_SETS, jar_dir, COMPLETE
print(" ".join(n for n in JAR_SETS if not (jar_dir(n) / COMPLETE).is_file()))')"
  [ -n "$missing" ] || return 0
  echo "==> fetching JARs from Maven Central with mvn: $missing (once, about a minute)"
  "$venv/bin/python" -m orchestrator.core.jars fetch $missing
}

setup_jvm_functions() {
  # kappa's own JVM functions (jobs/lib/source/jvm/*.java), compiled once with the JDK's javac into
  # ~/.cache/kappa/jvm/ (jobs/lib/runtime/jvm.py); a JRE without javac gets Debian's JDK 17 first
  if [ ! -x "$JAVA_HOME/bin/javac" ]; then
    echo "==> installing Debian's openjdk-17-jdk-headless (javac compiles kappa's JVM functions)"
    apt_install openjdk-17-jdk-headless
  fi
  "$venv/bin/python" -m jobs.lib.runtime.jvm
}

pg_ready() {
  "$venv/bin/python" - <<'PY' 2>/dev/null
import psycopg2
psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres", connect_timeout=3).close()
PY
}

setup_postgres() {
  # the tests' PostgreSQL: 127.0.0.1:5432, trust auth for user postgres (KAPPA_TEST_POSTGRES_URL points elsewhere)
  [ -n "${KAPPA_TEST_POSTGRES_URL:-}" ] && return
  pg_ready && return
  if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    echo "==> installing Debian's postgresql for the registry tests"
    apt_install postgresql
  fi
  command -v pg_lsclusters >/dev/null || die "PostgreSQL is installed without Debian's cluster tools; start one on 127.0.0.1:5432 with trust auth for user postgres"
  local ver
  ver="$(ls /usr/lib/postgresql | sort -V | tail -n 1)"
  pg_lsclusters -h | awk '{print $1" "$2}' | grep -q "^$ver main$" || pg_createcluster "$ver" main >/dev/null
  local conf="/etc/postgresql/$ver/main"
  if ! grep -q "kappa tests" "$conf/pg_hba.conf"; then
    # trust for user postgres on loopback, first, so it wins over the packaged rules
    { echo "# kappa tests: trust auth for user postgres on loopback"
      echo "host all postgres 127.0.0.1/32 trust"
      echo "host all postgres ::1/128 trust"
      cat "$conf/pg_hba.conf"; } > "$conf/pg_hba.conf.kappa" && mv "$conf/pg_hba.conf.kappa" "$conf/pg_hba.conf"
    chown postgres:postgres "$conf/pg_hba.conf"
  fi
  echo "==> starting PostgreSQL $ver on 127.0.0.1:5432"
  pg_ctlcluster "$ver" main start 2>/dev/null || pg_ctlcluster "$ver" main reload
  for _ in $(seq 1 30); do pg_ready && return; sleep 1; done
  die "PostgreSQL did not answer on 127.0.0.1:5432 as user postgres within 30 s: see /var/log/postgresql/"
}

setup_chromium() {
  [ -x /usr/bin/chromium ] && return
  echo "==> installing Debian's chromium for the Airflow UI test"
  apt_install chromium
}

setup_toxiproxy() {
  # the fault suite's network faults (tests/faults/test_faults_network.py): Shopify's Toxiproxy server,
  # built once with Go through the Go module proxy into the venv's bin as toxiproxy-server
  local version="2.5.0"
  local bin="$venv/bin/toxiproxy-server"
  [ -x "$bin" ] && [ -f "$venv/.toxiproxy-$version" ] && return
  local go
  go="$(command -v go || true)"
  [ -n "$go" ] || { [ -x /usr/local/go/bin/go ] && go=/usr/local/go/bin/go; }
  if [ -z "$go" ]; then
    echo "==> installing Debian's golang-go (it builds Toxiproxy for the fault suite)"
    apt_install golang-go
    go="$(command -v go)"
  fi
  echo "==> building Toxiproxy $version with go install (once, about a minute)"
  local gotmp
  gotmp="$(mktemp -d)"
  GOPATH="$gotmp/gopath" GOBIN="$gotmp/bin" GOCACHE="$gotmp/cache" GOFLAGS=-modcacherw \
    "$go" install "github.com/Shopify/toxiproxy/v2/cmd/server@v$version" \
    || { rm -rf "$gotmp"; die "go install of Toxiproxy $version failed (it needs the Go module proxy)"; }
  install -m 0755 "$gotmp/bin/server" "$bin"
  rm -rf "$gotmp"
  touch "$venv/.toxiproxy-$version"
}

JAVA_HOME="$(find_java17)" || die "Java 17 is required: install openjdk-17 (apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
export JAVA_HOME
export SPARK_LOCAL_IP=127.0.0.1

cmd="${1:-}"; shift || true
case "$cmd" in
  demo)
    setup_python
    setup_jars
    setup_jvm_functions
    setup_spark_cds
    exec "$venv/bin/kappa" demo "$@"
    ;;
  test)
    setup_python
    setup_jars
    setup_jvm_functions
    setup_spark_cds
    setup_postgres
    setup_chromium
    setup_toxiproxy
    # Two pytest-xdist workers: the integration tests wait on brokers, JVMs and micro-batch triggers for
    # much of their time, so two of them share the two cores well; each unit of work (a test file, or
    # tests/integration/airflow with its Airflow stack) goes whole to one worker (tests/conftest.py).
    # KAPPA_TEST_WORKERS=0 runs the suite in this process; arguments after `test` go to pytest.
    exec "$venv/bin/python" -m pytest -n "${KAPPA_TEST_WORKERS:-2}" --no-loadscope-reorder "$@"
    ;;
  setup)
    setup_python
    setup_jars
    setup_jvm_functions
    setup_spark_cds
    setup_toxiproxy
    ;;
  *)
    die "usage: deploy/dev.sh demo|test|setup [args...]"
    ;;
esac
