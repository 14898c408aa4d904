"""The pointer file: atomic replace, resolve/open, publish follows the registry."""

from __future__ import annotations

import json
import threading

import pytest

from control_helpers import ALIAS, PIPELINE, allocate, profiles, write_table
from orchestrator.core.exceptions import NotFoundError, SinkError
from orchestrator.serving import open_alias, publish_current, resolve_alias, write_pointer


def test_resolve_an_unpublished_alias_names_the_file_and_the_fix(k):
    with pytest.raises(NotFoundError) as e:
        resolve_alias(ALIAS, k.settings)
    path = k.settings.warehouse / "_aliases" / f"{ALIAS}.json"
    assert str(e.value) == (f"alias '{ALIAS}' is not published: no pointer file at {path}; promote a version "
                            f"of its pipeline first (`kappa promote <pipeline> <version>`)")


def test_write_pointer_replaces_atomically_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "_aliases" / "a.json"
    write_pointer(path, {"version": 1})
    write_pointer(path, {"version": 2})
    assert json.loads(path.read_text()) == {"version": 2}
    assert [p.name for p in path.parent.iterdir() if not p.name.startswith(".a.lock")] == ["a.json"]


def test_publish_current_writes_what_the_registry_says_and_marks_it(k):
    v1, v2 = allocate(k).version, allocate(k).version
    write_table(k.paths(PIPELINE, v1).table, profiles([("m1", "swe", "SWE", "Ada", 1)]))
    write_table(k.paths(PIPELINE, v2).table, profiles([("m1", "swe", "Software Engineer", "Ada", 1)]))
    assert publish_current(k, ALIAS) is None  # no alias yet: nothing to publish
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v1, actor="t", reason="r")
    p = publish_current(k, ALIAS)
    assert p["version"] == v1 and p["table"] == str(k.paths(PIPELINE, v1).table)
    assert resolve_alias(ALIAS, k.settings) == p
    assert k.registry.get_alias(ALIAS).published_version == v1
    assert open_alias(ALIAS, k.settings).to_pyarrow_table()["title"].to_pylist() == ["SWE"]
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=v1, new_version=v2, actor="t", reason="r")
    publish_current(k, ALIAS)
    assert open_alias(ALIAS, k.settings).to_pyarrow_table()["title"].to_pylist() == ["Software Engineer"]


def test_racing_publishers_leave_the_pointer_equal_to_the_registry(k):
    versions = [allocate(k).version for _ in range(2)]
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=versions[0], actor="t", reason="r")
    errors = []

    def flipper():
        cur = versions[0]
        for _ in range(20):
            nxt = versions[1] if cur == versions[0] else versions[0]
            k.registry.flip_alias(ALIAS, PIPELINE, expected_version=cur, new_version=nxt, actor="t", reason="r")
            cur = nxt
            publish_current(k, ALIAS)

    def publisher():
        try:
            for _ in range(20):
                publish_current(k, ALIAS)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=flipper)] + [threading.Thread(target=publisher) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    publish_current(k, ALIAS)
    assert resolve_alias(ALIAS, k.settings)["version"] == k.registry.get_alias(ALIAS).version


def test_open_alias_whose_table_is_gone(k):
    v = allocate(k).version
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v, actor="t", reason="r")
    publish_current(k, ALIAS)
    with pytest.raises(SinkError, match=rf"alias '{ALIAS}' points at {PIPELINE} v{v}, whose table .* cannot be opened"):
        open_alias(ALIAS, k.settings)
