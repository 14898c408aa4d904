"""The pointer file: atomic replace, resolve/open, publish follows the registry."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from control_helpers import ALIAS, PIPELINE, allocate, profiles, write_table
from orchestrator.core.exceptions import NotFoundError, SinkError
from orchestrator.serving import open_alias, publish_current, resolve_alias, write_pointer
from orchestrator.core.tables import read_table


def test_resolve_an_unpublished_alias_names_the_file_and_the_fix(k):
    with pytest.raises(NotFoundError) as e:
        resolve_alias(ALIAS, k.settings)
    path = Path(k.settings.warehouse) / "_aliases" / f"{ALIAS}.json"
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
    assert read_table(open_alias(ALIAS, k.settings))["title"].to_pylist() == ["SWE"]
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=v1, new_version=v2, actor="t", reason="r")
    publish_current(k, ALIAS)
    assert read_table(open_alias(ALIAS, k.settings))["title"].to_pylist() == ["Software Engineer"]


def _published_state(k) -> tuple[int, int, int]:
    """(pointer file's version, registry's version, registry's published_version), as they are now."""
    rec = k.registry.get_alias(ALIAS)
    return resolve_alias(ALIAS, k.settings)["version"], rec.version, rec.published_version


def test_racing_publishers_leave_the_pointer_equal_to_the_registry(k):
    """A flipper (flip, then publish, as promote and rollback do) against three plain publishers;
    the state they leave is checked as it is, with no publish after them."""
    versions = [allocate(k).version for _ in range(2)]
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=versions[0], actor="t", reason="r")
    start = threading.Barrier(4, timeout=30)

    def flipper():
        start.wait()
        cur = versions[0]
        for _ in range(20):
            nxt = versions[1] if cur == versions[0] else versions[0]
            k.registry.flip_alias(ALIAS, PIPELINE, expected_version=cur, new_version=nxt, actor="t", reason="r")
            cur = nxt
            publish_current(k, ALIAS)

    def publisher():
        start.wait()
        for _ in range(20):
            publish_current(k, ALIAS)

    threads = [threading.Thread(target=flipper)] + [threading.Thread(target=publisher) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a publisher still runs after 60 s"
    assert k.registry.get_alias(ALIAS).version == versions[0]   # 20 flips: back where it started
    assert _published_state(k) == (versions[0],) * 3


class _PausedPublish:
    """Forces the interleaving a stale publish needs: publisher A has read the registry and not yet
    written the pointer; the alias moves; publisher B publishes (as the flip's promote or rollback
    does); only then A goes on.

    Hooks: the registry read of thread A pauses after it returns; thread B's lock attempt reports
    when it would block (the lock A holds). A is let go once B is blocked or done.
    """

    def __init__(self, k, monkeypatch):
        import fcntl

        self.k = k
        self.a_has_read, self.a_go, self.b_stuck_or_done = threading.Event(), threading.Event(), threading.Event()
        self.a = self.b = None
        real_get_alias = k.registry.get_alias

        def get_alias(alias):
            rec = real_get_alias(alias)
            if threading.current_thread() is self.a and not self.a_has_read.is_set():
                self.a_has_read.set()
                if not self.a_go.wait(30):
                    raise AssertionError("publisher A was never let go")
            return rec

        class Fcntl:
            LOCK_EX, LOCK_UN, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_UN, fcntl.LOCK_NB

            @staticmethod
            def flock(fd, op):
                if threading.current_thread() is self.b and op == fcntl.LOCK_EX:
                    try:
                        return fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        self.b_stuck_or_done.set()
                return fcntl.flock(fd, op)

        monkeypatch.setattr(k.registry, "get_alias", get_alias)
        monkeypatch.setattr("orchestrator.serving.fcntl", Fcntl)

    def run(self, flip_from: int, flip_to: int) -> None:
        """A publishes; once it has read the registry the alias flips, then B publishes; both finish."""
        def b_then_done():
            try:
                publish_current(self.k, ALIAS)
            finally:
                self.b_stuck_or_done.set()

        self.a = threading.Thread(target=publish_current, args=(self.k, ALIAS), name="publisher-A")
        self.b = threading.Thread(target=b_then_done, name="publisher-B")
        self.a.start()
        if not self.a_has_read.wait(30):
            pytest.fail("publisher A never read the registry")
        self.k.registry.flip_alias(ALIAS, PIPELINE, expected_version=flip_from, new_version=flip_to, actor="t",
                                   reason="r")
        self.b.start()
        if not self.b_stuck_or_done.wait(30):
            pytest.fail("publisher B neither finished nor waited for publisher A's lock within 30 s")
        self.a_go.set()
        for t in (self.a, self.b):
            t.join(30)
            if t.is_alive():
                pytest.fail(f"{t.name} still runs 30 s after publisher A was let go")


def test_a_publish_that_read_the_registry_before_a_flip_does_not_overwrite_the_newer_pointer(k, monkeypatch):
    v1, v2 = allocate(k).version, allocate(k).version
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v1, actor="t", reason="r")
    _PausedPublish(k, monkeypatch).run(flip_from=v1, flip_to=v2)
    assert _published_state(k) == (v2, v2, v2)
    assert [h.to_version for h in k.registry.alias_history(ALIAS)] == [v1, v2]


def test_a_stale_publish_racing_a_flip_back_leaves_the_pointer_on_the_registry(k, monkeypatch):
    """The alias is at v2, unpublished (the pointer still says v1); A reads v2; a rollback moves it
    back to v1 and publishes (the pointer already says v1); then A goes on."""
    v1, v2 = allocate(k).version, allocate(k).version
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v1, actor="t", reason="r")
    publish_current(k, ALIAS)
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=v1, new_version=v2, actor="t", reason="r")
    _PausedPublish(k, monkeypatch).run(flip_from=v2, flip_to=v1)
    assert _published_state(k) == (v1, v1, v1)


def test_open_alias_whose_table_is_gone(k):
    v = allocate(k).version
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v, actor="t", reason="r")
    publish_current(k, ALIAS)
    with pytest.raises(SinkError, match=rf"alias '{ALIAS}' points at {PIPELINE} v{v}, whose table .* cannot be opened"):
        open_alias(ALIAS, k.settings)


def test_the_served_comparison_of_the_live_tests_forgives_no_column_type_row_or_reject(tmp_path, seed):
    """tests/served.py, which the live, cluster and Airflow tests compare with: a table read back
    from Delta in any row order equals the oracle's; an extra, missing or recast column, a
    nullability, a cell, or a reject's reason, position or copy does not."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from orchestrator.dev.datagen import LogRecord, generate_changelog
    from tests.oracle.standardize import expected_table
    from tests.served import REJECTS_SCHEMA, rejects_diff, table_diff

    log = [LogRecord(r.key, r.value, 0, off, 1_700_000_000_000 + off)
           for off, r in enumerate(generate_changelog(300, 60, seed=seed, malformed_share=0.3))]
    exp = expected_table(log, "v1")
    assert exp.rejects and exp.table.num_rows > 10
    write_deltalake(str(tmp_path / "t"), exp.table)
    served = read_table(str(tmp_path / "t"))
    n, names = exp.table.num_rows, exp.table.column_names
    assert table_diff(served.take(list(reversed(range(n)))), exp.table) is None

    extra = served.append_column("_deleted", pa.array([False] * n))
    assert table_diff(extra, exp.table) == f"served columns {names + ['_deleted']} are not the expected {names}"
    assert table_diff(served.drop_columns(["location"]), exp.table).startswith("served columns ")
    recast = served.set_column(7, "source_partition", served["source_partition"].cast(pa.int64()))
    assert table_diff(recast, exp.table) == "served schema differs: source_partition is int64, expected int32"
    strict = served.cast(served.schema.set(0, served.schema.field(0).with_nullable(False)))
    assert table_diff(strict, exp.table) == "served schema differs: member_id is string not null, expected string"
    key, title = served["member_id"][0].as_py(), served["title"][0].as_py()
    wrong = served.set_column(3, "title", pa.array(["Wrong Title"] + served["title"].to_pylist()[1:], pa.string()))
    assert table_diff(wrong, exp.table) == (f"served {n} rows, expected {n}: {{'missing': [], 'extra': [], "
                                            f"'title': [({key!r}, 'Wrong Title', {title!r})]}}")
    assert table_diff(served.slice(1), exp.table).startswith(f"served {n - 1} rows, expected {n}: {{'missing': "
                                                             f"[{key!r}], 'extra': []")

    by_pos = {(r.partition, r.offset): r for r in log}

    def rejects(rows):
        return pa.Table.from_pylist([{"key": by_pos[p, o].key, "value": by_pos[p, o].value, "topic": "t",
                                      "partition": p, "offset": o, "error": why, "batch_id": 0}
                                     for p, o, why in rows], schema=REJECTS_SCHEMA)

    assert rejects_diff(rejects(exp.rejects), exp, by_pos, "t") is None
    (p, o, why), rest = exp.rejects[0], exp.rejects[1:]
    cut = why.split(":")[0] + ":"   # the reason's prefix only
    assert f"'different': [(({p}, {o}), " in rejects_diff(rejects([(p, o, cut)] + rest), exp, by_pos, "t")
    assert rejects_diff(rejects(rest), exp, by_pos, "t").startswith(f"{len(rest)} rejects, expected "
                                                                     f"{len(exp.rejects)}: {{'missing': [({p}, {o})]")
    assert rejects_diff(rejects(exp.rejects + [(p, o, why)]), exp, by_pos, "t") == "1 rejects are recorded twice"
    untyped = rejects(exp.rejects).cast(REJECTS_SCHEMA.set(3, pa.field("partition", pa.int64())))
    assert rejects_diff(untyped, exp, by_pos, "t") == "rejects schema differs: partition is int64, expected int32"
