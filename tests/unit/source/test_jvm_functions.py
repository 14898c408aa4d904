"""kappa's own JVM functions (`jobs.lib.runtime.jvm`): compiled once into the cache, keyed by their
sources, and one line when they cannot be."""

from __future__ import annotations

import os
import zipfile

import pytest

from jobs.lib.runtime import jvm
from orchestrator.core.jars import JarsError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_jar_is_compiled_once_and_a_changed_source_gets_a_new_one(cache, tmp_path, monkeypatch):
    jar = jvm.kappa_jar()
    assert jar.parent == cache / "kappa" / "jvm" and jar.is_file()
    assert "kappa/jvm/JsonFields.class" in zipfile.ZipFile(jar).namelist()
    stamp = jar.stat().st_mtime_ns
    assert jvm.kappa_jar() == jar and jar.stat().st_mtime_ns == stamp          # not compiled again
    src = tmp_path / "src"
    src.mkdir()
    (src / "JsonFields.java").write_text((jvm.SOURCES / "JsonFields.java").read_text() + "\n// changed\n")
    monkeypatch.setattr(jvm, "SOURCES", src)
    assert jvm.kappa_jar() != jar and jvm.kappa_jar().is_file()
    assert not [p for p in jar.parent.iterdir() if p.name.startswith(".")]   # no temporary folder left


def test_a_source_that_does_not_compile_is_one_line_with_javac_s_error(cache, tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "Broken.java").write_text("package kappa.jvm; public final class Broken { int x = ; }\n")
    monkeypatch.setattr(jvm, "SOURCES", src)
    with pytest.raises(JarsError) as err:
        jvm.kappa_jar()
    message = str(err.value)
    assert "\n" not in message and message.startswith("kappa's JVM functions do not compile")
    assert "Broken.java" in message and "illegal start of expression" in message
    assert not jvm.jar_path().exists()


def test_a_java_without_javac_is_one_line_naming_the_jdk_to_install(cache, tmp_path, monkeypatch):
    jre = tmp_path / "jre"
    (jre / "bin").mkdir(parents=True)
    monkeypatch.setattr(jvm, "find_java17", lambda: str(jre))
    with pytest.raises(JarsError) as err:
        jvm.kappa_jar()
    assert str(err.value) == (f"kappa's JVM functions need a JDK's javac to compile, and {jre}/bin/javac is missing: "
                              f"install a JDK 17 (apt-get install openjdk-17-jdk-headless) or set JAVA_HOME to one")


def test_the_setup_s_build_command_compiles_once_and_says_so(cache):
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    first = subprocess.run([sys.executable, "-m", "jobs.lib.runtime.jvm"], capture_output=True, text=True, env=env)
    assert first.returncode == 0 and first.stderr == f"==> compiling kappa's JVM functions (once): {jvm.jar_path()}\n"
    again = subprocess.run([sys.executable, "-m", "jobs.lib.runtime.jvm"], capture_output=True, text=True, env=env)
    assert again.returncode == 0 and again.stderr == ""                 # already compiled: silent


def test_a_cached_jar_is_used_on_a_java_without_javac(cache, tmp_path, monkeypatch):
    """javac is needed to compile, not to find the JAR the setup compiled: a JRE-only machine (or a JDK whose javac
    was removed since) runs with the cached JAR."""
    jre = tmp_path / "jre"
    (jre / "bin").mkdir(parents=True)
    monkeypatch.setattr(jvm, "find_java17", lambda: str(jre))
    cached = jvm.jar_path()
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"the JAR the setup compiled")
    assert jvm.kappa_jar() == cached and cached.read_bytes() == b"the JAR the setup compiled"
