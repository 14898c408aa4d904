#!/usr/bin/env bash
# The README's two commands:
#   deploy/dev.sh demo   set up .venv and run the demo on the embedded stack
#   deploy/dev.sh test   set up .venv (+ Debian's chromium for the UI test) and run the whole suite
# Java 17 is the only prerequisite. Everything else comes from PyPI and Debian.
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
  echo "==> setting up $venv (PyPI: pyspark, deltalake, confluent-kafka, airflow, tansu broker; takes a few minutes the first time)"
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -e ".[test]"
  echo "$want" > "$stamp"
}

setup_spark_cds() {
  # the Spark driver JVM's class-data-sharing archive (jobs/lib/session.py): about 20 s once, then
  # every Spark start-up is about 1.5 s shorter; a no-op once the archive exists
  "$venv/bin/python" -c '
from jobs.lib.session import cds_archive_path, create_cds_archive
if not cds_archive_path().is_file():
    print("==> making the Spark driver class-data-sharing archive (once, about 20 s)", flush=True)
    print("    " + str(create_cds_archive() or "not made: Spark starts without it"))' || true
}

setup_chromium() {
  [ -x /usr/bin/chromium ] && return
  echo "==> installing Debian's chromium for the Airflow UI test"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  command -v apt-get >/dev/null || die "the UI test needs /usr/bin/chromium; install Debian's chromium package"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
}

JAVA_HOME="$(find_java17)" || die "Java 17 is required: install openjdk-17 (apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
export JAVA_HOME
export SPARK_LOCAL_IP=127.0.0.1

cmd="${1:-}"; shift || true
case "$cmd" in
  demo)
    setup_python
    setup_spark_cds
    exec "$venv/bin/kappa" demo "$@"
    ;;
  test)
    setup_python
    setup_spark_cds
    setup_chromium
    exec "$venv/bin/python" -m pytest "$@"
    ;;
  setup)
    setup_python
    setup_spark_cds
    ;;
  *)
    die "usage: deploy/dev.sh demo|test|setup [args...]"
    ;;
esac
