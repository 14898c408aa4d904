"""The flip benchmark judged from outside: its readers write down every read, and the test decides
from those records (not from the benchmark's own error counter) whether a reader ever saw a
half-written pointer, a pointer to something else, a table that did not match it, or an error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import orchestrator.serving as serving
from control_helpers import ALIAS, PIPELINE, allocate, make_spec, profiles, wait_for, write_table
from orchestrator.context import Kappa
from orchestrator.dev.flipbench import flip_benchmark
from orchestrator.serving import publish_current, resolve_alias


def observations(record_dir: Path) -> list[tuple[str, dict]]:
    """(where, record) of every complete line the readers wrote."""
    out = []
    for f in sorted(record_dir.glob("reader-*.jsonl")):
        lines = f.read_text(encoding="utf-8").split("\n")[:-1]   # a line still being written is not yet one
        out += [(f"{f.name}:{n}", json.loads(line)) for n, line in enumerate(lines, 1)]
    return out


def reader_problems(record_dir: Path, tables: dict[int, tuple[str, int]]) -> list[str]:
    """What the readers' records show went wrong; `tables`: version -> (table path, rows)."""
    problems = []
    for where, obs in observations(record_dir):
        if obs["error"] is not None:
            problems.append(f"{where}: {obs['error']}")
        try:
            pointer = json.loads(obs["pointer"])
        except (TypeError, ValueError):
            problems.append(f"{where}: half-written pointer {obs['pointer']!r}")
            continue
        want = tables.get(pointer.get("version"))
        if want is None or pointer.get("table") != want[0]:
            problems.append(f"{where}: pointer to neither version: {pointer}")
        elif obs["error"] is None and obs["rows"] != want[1]:
            problems.append(f"{where}: {obs['rows']} rows read for v{pointer['version']}, whose table has {want[1]}")
    return problems


@pytest.fixture
def two_versions(k):
    """A pipeline whose alias serves v2 and served v1 before; {version: (table, rows)}."""
    kk = Kappa(k.settings, registry=k.registry, pipelines={PIPELINE: make_spec()})
    v1, v2 = allocate(kk).version, allocate(kk).version
    write_table(kk.paths(PIPELINE, v1).table, profiles([("m1", "a", "A", "n", 1)]))
    write_table(kk.paths(PIPELINE, v2).table, profiles([("m1", "a", "B", "n", 1), ("m2", "b", "B", "n", 2)]))
    kk.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v1, actor="t", reason="r")
    kk.registry.flip_alias(ALIAS, PIPELINE, expected_version=v1, new_version=v2, actor="t", reason="r")
    return kk, {v1: (str(kk.paths(PIPELINE, v1).table), 1), v2: (str(kk.paths(PIPELINE, v2).table), 2)}


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_readers_records_show_only_whole_pointers_and_matching_tables(tmp_path, two_versions, mode):
    kk, tables = two_versions
    v2 = max(tables)
    figures = flip_benchmark(kk, PIPELINE, flips=21, readers=2, reader_mode=mode, warmup_seconds=0.2,
                             record_dir=tmp_path / "reads")
    seen = observations(tmp_path / "reads")
    assert reader_problems(tmp_path / "reads", tables) == []
    assert {where.split(":")[0] for where, _ in seen} == {"reader-0.jsonl", "reader-1.jsonl"}
    assert len(seen) == figures["reads"] + figures["reader_errors"] and figures["reader_errors"] == 0
    assert figures["flips"] == 21 and figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert 0 < figures["flipper_cpu_seconds"]
    assert kk.registry.get_alias(ALIAS).version == v2 and resolve_alias(ALIAS, kk.settings)["version"] == v2
    assert kk.registry.audit_log(PIPELINE, action="flipbench")[-1].details["flips"] == 21


def test_a_torn_pointer_is_caught_by_the_readers_records(tmp_path, two_versions, monkeypatch):
    """Publish non-atomically and hold the half-written file until a reader has read it: the records
    must show it (so the check above can fail), and so must the benchmark's counter."""
    kk, tables = two_versions
    reads = tmp_path / "reads"
    publish_current(kk, ALIAS)   # the benchmark's first publish then has nothing to write
    torn: list[str] = []

    def torn_write(path: str, pointer: dict) -> None:
        path = Path(path)
        text = json.dumps(pointer)
        half = text[: len(text) // 2]
        path.write_text(half)
        torn.append(half)
        wait_for(lambda: any(o["pointer"] == half for _, o in observations(reads)), 30,
                 f"a reader to read the half-written pointer {half!r}")
        path.write_text(text)

    monkeypatch.setattr(serving, "write_pointer", torn_write)
    figures = flip_benchmark(kk, PIPELINE, flips=2, readers=2, reader_mode="thread", warmup_seconds=0,
                             record_dir=reads)
    problems = reader_problems(reads, tables)
    assert len(torn) == 2
    for half in torn:
        assert f"half-written pointer {half!r}" in "\n".join(problems)
    assert figures["reader_errors"] >= 2 and figures["goal_met"] is False
    assert len(observations(reads)) == figures["reads"] + figures["reader_errors"]
