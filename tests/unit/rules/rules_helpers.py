"""Helpers of the rules tests: a served standardize table, published the way promote publishes it."""

from __future__ import annotations

import pyarrow as pa

from jobs.lib.rules.files import load_rules, rules_path

PIPELINE = "standardize"   # deploy/pipelines.toml: ruleset "titles", alias "member_profiles_std"
ALIAS = "member_profiles_std"


def standardized(rows: list[tuple[str, str | None, str | None]], rules_version: str) -> pa.Table:
    """(member_id, title_raw, company_raw) rows as the standardize job writes them under `rules_version`."""
    rules = load_rules(rules_path("titles", rules_version))
    ids, titles, companies = (list(c) for c in zip(*rows))
    title_raw, company_raw = pa.array(titles, pa.string()), pa.array(companies, pa.string())
    return pa.table({
        "member_id": pa.array(ids, pa.string()),
        "name": pa.array([f"name of {i}" for i in ids], pa.string()),
        "title_raw": title_raw,
        "title": rules.standardize_array("titles", title_raw),
        "company_raw": company_raw,
        "company": rules.standardize_array("companies", company_raw),
        "location": pa.array(["Lyon"] * len(ids), pa.string()),
        "source_partition": pa.array([0] * len(ids), pa.int32()),
        "source_offset": pa.array(range(len(ids)), pa.int64()),
    })


def serve(k, table: pa.Table, *, rules_version: str = "v1", pipeline: str = PIPELINE) -> dict:
    """Allocate a version, write `table` as its Delta table, flip the alias to it and publish the
    pointer (`publish_current`, as promote does); returns the pointer."""
    from deltalake import write_deltalake

    from orchestrator.serving import publish_current

    rules = load_rules(rules_path("titles", rules_version))
    rec = k.registry.allocate_version(pipeline, rules_version=rules_version, rules_hash=rules.content_hash,
                                      code_ref="test", paths=lambda n: k.paths(pipeline, n), actor="tester",
                                      reason="rules test", queue=True)
    write_deltalake(str(k.paths(pipeline, rec.version).table), table, mode="overwrite")
    alias = k.pipeline(pipeline).alias
    current = k.registry.get_alias(alias)
    k.registry.flip_alias(alias, pipeline, expected_version=current.version if current else None,
                          new_version=rec.version, actor="tester", reason="rules test")
    return publish_current(k, alias)
