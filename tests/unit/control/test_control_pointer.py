"""A damaged pointer file is repaired by publish and reconcile, and named to readers; file modes and
the temporary files a crashed write leaves."""

from __future__ import annotations

from pathlib import Path
import json
import os
import stat
import subprocess
import sys
import time

import pytest

from control_helpers import ALIAS, PIPELINE, allocate, profiles, write_table
from orchestrator.airflow import stack as airflow_stack
from orchestrator.core.exceptions import SinkError
from orchestrator.core.files import STALE_TMP_SECONDS, write_atomic
from orchestrator.lifecycle.reconcile import reconcile
from orchestrator.serving import open_alias, publish_current, read_pointer, resolve_alias


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _published(k) -> tuple[int, os.PathLike]:
    v = allocate(k).version
    write_table(k.paths(PIPELINE, v).table, profiles([("m1", "swe", "SWE", "Ada", 1)]))
    k.registry.set_state(PIPELINE, v, "serving")
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v, actor="t", reason="r")
    publish_current(k, ALIAS)
    return v, Path(k.alias_file(ALIAS))


@pytest.mark.parametrize("damage", [
    lambda raw: raw[: len(raw) // 2],            # truncated (full disk, a partial copy)
    lambda raw: b"",                             # empty
    lambda raw: b"[1, 2]\n",                     # JSON, not a pointer
    lambda raw: b'{"alias": "x"}\n',             # an object without pipeline/version/table
], ids=["truncated", "empty", "list", "no-fields"])
def test_a_damaged_pointer_is_named_to_readers_and_repaired_by_reconcile(k, damage):
    v, path = _published(k)
    good = json.loads(path.read_bytes())
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(SinkError) as e:          # was a bare JSONDecodeError (or a KeyError) in readers
        resolve_alias(ALIAS, k.settings)
    assert str(e.value).startswith(f"the alias pointer file {path} is damaged (")
    assert str(e.value).endswith("); rewrite it from the registry with `kappa reconcile`")
    with pytest.raises(SinkError):
        open_alias(ALIAS, k.settings)
    assert read_pointer(path) is None            # for publishers: "no pointer", i.e. rewrite it
    actions = reconcile(k, actor="tester")       # was: JSONDecodeError, reconcile stopped for every pipeline
    assert [a["kind"] for a in actions if a.get("alias") == ALIAS] == ["publish"]
    pointer = resolve_alias(ALIAS, k.settings)
    assert {f: pointer[f] for f in ("pipeline", "version", "table")} == {
        f: good[f] for f in ("pipeline", "version", "table")}
    assert open_alias(ALIAS, k.settings).version() == 0


def test_publish_rewrites_a_truncated_pointer(k):
    v, path = _published(k)
    path.write_bytes(path.read_bytes()[:10])
    assert publish_current(k, ALIAS)["version"] == v       # was: JSONDecodeError
    assert resolve_alias(ALIAS, k.settings)["version"] == v


def test_the_pointer_is_readable_by_readers(k):
    _, path = _published(k)
    assert _mode(path) == 0o644                  # was 0600: only the orchestrator's user could read it


def test_a_file_of_secrets_is_created_0600_and_never_widened(tmp_path, monkeypatch):
    """The Airflow password file: `os.open` with mode 0600, no chmod at any moment."""
    chmods = []
    real_fchmod = os.fchmod
    monkeypatch.setattr(os, "fchmod", lambda fd, mode: (chmods.append(mode), real_fchmod(fd, mode)))
    write_atomic(tmp_path / airflow_stack.PASSWORDS_FILE, '{"admin": "pw"}', mode=0o600)
    assert _mode(tmp_path / airflow_stack.PASSWORDS_FILE) == 0o600 and chmods == []
    write_atomic(tmp_path / "pointer.json", "{}", mode=0o644)
    assert _mode(tmp_path / "pointer.json") == 0o644 and chmods == [0o644]


def test_the_temporary_file_of_a_killed_writer_is_removed_by_the_next_write(tmp_path):
    """A writer killed between writing its temporary file and the rename leaves the file behind;
    the next write of the same file removes it once it is old enough to be nobody's write in
    progress, and leaves a young one (a concurrent writer's) alone."""
    target = tmp_path / "launch.json"
    code = ("import os, sys\n"
            "from orchestrator.core import files\n"
            "os.replace = lambda *a: os._exit(137)   # die between fsync and rename\n"
            "files.write_atomic(sys.argv[1], 'x' * 100)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(target)], cwd=os.getcwd(), timeout=60)
    assert proc.returncode == 137
    (left,) = [p for p in tmp_path.iterdir()]
    assert left.name.startswith(".launch.json.") and left.name.endswith(".tmp") and not target.exists()
    young = tmp_path / f".launch.json.{os.getpid()}.young.tmp"
    young.write_text("a write in progress")
    write_atomic(target, "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["launch.json", left.name, young.name])
    old = time.time() - STALE_TMP_SECONDS - 1
    os.utime(left, (old, old))
    write_atomic(target, "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["launch.json", young.name])
