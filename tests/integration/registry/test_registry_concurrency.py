"""Concurrent deploys and flips: never a duplicate number, exactly one flip wins.

Threads each open their own Registry (their own engine and connections); processes are
spawned, so they share nothing with the test process but the database.
"""

from __future__ import annotations

import multiprocessing
import threading

import pytest
from registry_helpers import allocate

from orchestrator.core.exceptions import ConflictError
from orchestrator.registry import HEAD, Registry

pytestmark = pytest.mark.integration

THREADS = 6


def run_together(n: int, fn):
    """Run fn(i) in n threads released at once; return (results, errors) by thread index."""
    barrier = threading.Barrier(n)
    results: dict[int, object] = {}
    errors: dict[int, BaseException] = {}

    def body(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn(i)
        except BaseException as e:  # collected and asserted on by the test
            errors[i] = e

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


@pytest.fixture
def registries(registry_url, registry):
    """One Registry per thread, each with its own connections (the `registry` fixture migrated)."""
    regs = [Registry(registry_url, auto_migrate=False) for _ in range(THREADS)]
    try:
        yield regs
    finally:
        for r in regs:
            r.close()


def test_concurrent_queued_allocations_never_share_a_number(registry, registries):
    per_thread = 4
    results, errors = run_together(THREADS, lambda i: [
        allocate(registries[i], actor=f"t{i}", queue=True).version for _ in range(per_thread)])
    assert errors == {}
    numbers = sorted(n for ns in results.values() for n in ns)
    assert numbers == list(range(1, THREADS * per_thread + 1))
    assert [v.version for v in registry.list_versions("standardize")] == numbers
    for ns in results.values():
        assert ns == sorted(ns)


def test_concurrent_deploys_exactly_one_wins_the_others_name_it(registry, registries):
    results, errors = run_together(THREADS, lambda i: allocate(registries[i], actor=f"t{i}").version)
    assert list(results.values()) == [1]
    assert len(errors) == THREADS - 1
    (winner,) = results
    for e in errors.values():
        assert isinstance(e, ConflictError)
        assert str(e).startswith(f"pipeline 'standardize' already has v1 in flight (state created, deployed by "
                                 f"t{winner} at ")
    assert [v.version for v in registry.list_versions("standardize")] == [1]
    outcomes = sorted(a.outcome for a in registry.audit_log("standardize", limit=None))
    assert outcomes == ["conflict"] * (THREADS - 1) + ["ok"]


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_flips_exactly_one_wins(registry, registries, round_):
    for _ in range(THREADS + 1):
        allocate(registry, queue=True)
    registry.flip_alias("member_profiles_std", "standardize", expected_version=None, new_version=1,
                        actor="setup", reason="v1")

    def flip(i: int):
        return registries[i].flip_alias("member_profiles_std", "standardize", expected_version=1,
                                        new_version=i + 2, actor=f"t{i}", reason=f"promote v{i + 2}")

    results, errors = run_together(THREADS, flip)
    assert len(results) == 1, errors
    ((winner, record),) = results.items()
    assert record.version == winner + 2
    assert len(errors) == THREADS - 1
    for e in errors.values():
        assert isinstance(e, ConflictError)
        assert str(e).startswith(f"alias 'member_profiles_std' points at v{winner + 2} now, not v1 as this flip "
                                 f"expected: it was moved by t{winner} at ")
    assert registry.get_alias("member_profiles_std").version == winner + 2
    history = registry.alias_history("member_profiles_std")
    assert [(h.from_version, h.to_version, h.actor) for h in history] == [(None, 1, "setup"),
                                                                         (1, winner + 2, f"t{winner}")]


def test_concurrent_alias_creation_exactly_one_wins(registry, registries):
    for _ in range(THREADS):
        allocate(registry, queue=True)
    results, errors = run_together(THREADS, lambda i: registries[i].flip_alias(
        "member_profiles_std", "standardize", expected_version=None, new_version=i + 1, actor=f"t{i}",
        reason="create"))
    assert len(results) == 1 and len(errors) == THREADS - 1
    assert all(isinstance(e, ConflictError) and "already exists" in str(e) for e in errors.values())
    assert len(registry.alias_history("member_profiles_std")) == 1


def _allocate_in_process(url: str, worker: int, count: int, barrier, out) -> None:
    reg = Registry(url, auto_migrate=False)
    try:
        barrier.wait(timeout=120)
        got = [allocate(reg, actor=f"p{worker}", queue=True).version for _ in range(count)]
        out.put((worker, got, None))
    except BaseException as e:  # reported to the parent, which fails the test
        out.put((worker, [], repr(e)))
    finally:
        reg.close()


def test_concurrent_allocations_from_processes_never_share_a_number(registry_url, registry):
    ctx = multiprocessing.get_context("spawn")
    workers, count = 4, 5
    barrier, out = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_allocate_in_process, args=(registry_url, w, count, barrier, out))
             for w in range(workers)]
    try:
        for p in procs:
            p.start()
        reports = [out.get(timeout=180) for _ in procs]
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:  # only if something hung: stop our own children, by their handle
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
    assert [p.exitcode for p in procs] == [0] * workers
    assert [err for _, _, err in reports if err] == []
    numbers = sorted(n for _, got, _ in reports for n in got)
    assert numbers == list(range(1, workers * count + 1))
    assert [v.version for v in registry.list_versions("standardize")] == numbers


def test_decisive_writes_take_the_documented_lock(registry):
    """BEGIN IMMEDIATE on SQLite; SELECT ... FOR UPDATE of the pipeline row on PostgreSQL."""
    import sqlalchemy as sa

    seen: list[str] = []

    def record(conn, cursor, statement, *args):
        seen.append(" ".join(statement.split()))

    sa.event.listen(registry._engine, "before_cursor_execute", record)
    try:
        allocate(registry)
    finally:
        sa.event.remove(registry._engine, "before_cursor_execute", record)
    if registry.dialect == "sqlite":
        assert seen[0] == "BEGIN IMMEDIATE"
    else:
        assert any(s.startswith("SELECT pipelines.last_version FROM pipelines") and s.endswith("FOR UPDATE")
                   for s in seen), seen


def test_concurrent_migrations_apply_each_step_once(registry_url):
    regs = [Registry(registry_url, auto_migrate=False) for _ in range(4)]
    try:
        results, errors = run_together(4, lambda i: regs[i].migrate())
        assert errors == {}
        assert sorted(results.values()) == [[], [], [], list(range(1, HEAD + 1))]
        assert regs[0].schema_version() == HEAD
    finally:
        for r in regs:
            r.close()


def _allocate_after_fork(reg: Registry, out) -> None:
    try:
        inherited = reg._engine.pool.checkedin()  # connections of the parent's pool visible here
        out.put((inherited, allocate(reg, actor="forked", queue=True).version))
    except BaseException as e:  # reported to the parent
        out.put((None, repr(e)))


def test_a_forked_child_uses_its_own_connections(registry):
    """A child forked with a Registry opens its own connections; the parent's keep working."""
    allocate(registry)
    assert registry._engine.pool.checkedin() >= 1
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_allocate_after_fork, args=(registry, out))
    child.start()
    try:
        inherited, got = out.get(timeout=120)
        child.join(timeout=60)
    finally:
        if child.is_alive():
            child.terminate()
            child.join(timeout=10)
    assert (inherited, got, child.exitcode) == (0, 2, 0)
    assert allocate(registry, queue=True).version == 3
    assert [v.actor for v in registry.list_versions("standardize")] == ["alice", "forked", "alice"]
