"""Every serving alias is an Airflow Asset: a DAG scheduled on it runs after each flip of the alias.

The Asset of alias `member_profiles_std` is named `kappa.member_profiles_std`, with the URI
`kappa://alias/member_profiles_std`; `kappa_alias_asset(alias)` is the one place that says so.
A downstream DAG schedules on it:

    from orchestrator.airflow.assets import kappa_alias_asset

    @dag(schedule=[kappa_alias_asset("member_profiles_std")], catchup=False)
    def refresh_dashboards(): ...

The tasks that flip an alias (`promote` in kappa_promote and kappa_reprocess, `flip` in
kappa_rollback) declare the AssetAlias `FLIPS` as their outlet: which alias a run flips is only
known when it runs. When the task moved the alias, `announce_flip` adds one event to the alias's
Asset through `FLIPS`, and Airflow records it when the task succeeds. Its `extra` says what is
served now (`FLIP_EXTRA_KEYS`): pipeline, alias, action, version, previous_version,
rules_version, rules_hash, table, actor, reason, at. A promote of the version that already serves,
or a refused flip, emits nothing; a retry of a task whose earlier try flipped the alias (and died
before Airflow could record the event) emits it then.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

from airflow.sdk import Asset, AssetAlias, AssetAny

from orchestrator.core.names import validate_alias_name

__all__ = ["FLIPS", "ASSET_NAME_PREFIX", "ASSET_URI_PREFIX", "FLIP_EXTRA_KEYS", "kappa_alias_asset",
           "declared_alias_assets", "any_flip_of", "announce_flip", "flip_events"]

log = logging.getLogger("kappa.airflow")

#: The outlet of every task that flips an alias; each event goes to the flipped alias's Asset.
FLIPS = AssetAlias("kappa.flips")
ASSET_NAME_PREFIX = "kappa."
#: A URI Airflow keeps as written (a `kappa://<alias>` would be stored as `kappa://<alias>/`).
ASSET_URI_PREFIX = "kappa://alias/"
FLIP_EXTRA_KEYS = ("pipeline", "alias", "action", "version", "previous_version", "rules_version", "rules_hash",
                   "table", "actor", "reason", "at")


def kappa_alias_asset(alias: str) -> Asset:
    """The Asset of serving alias `alias`: name `kappa.<alias>`, URI `kappa://alias/<alias>`.

    A name that cannot be an alias raises ConfigError (a typo would otherwise schedule a DAG that never runs).
    """
    validate_alias_name(alias)
    return Asset(name=f"{ASSET_NAME_PREFIX}{alias}", uri=f"{ASSET_URI_PREFIX}{alias}")


def declared_alias_assets(settings: Any = None) -> dict[str, Asset]:
    """alias -> Asset for every pipeline in the pipelines file (read at parse time; nothing else is touched)."""
    from orchestrator.airflow.settings_var import airflow_settings
    from orchestrator.core.pipelines import load_pipelines

    specs = load_pipelines((settings or airflow_settings()).pipelines_file)
    return {spec.alias: kappa_alias_asset(spec.alias) for spec in specs.values()}


def any_flip_of(assets: Iterable[Asset]) -> AssetAny | None:
    """A schedule that runs after a flip of any of `assets` (None when there are none)."""
    assets = list(assets)
    return AssetAny(*assets) if assets else None


def announce_flip(k: Any, outlet_events: Any, *, action: str, pipeline: str, alias: str, version: int,
                  previous_version: int | None, flipped: bool, run_tag: str, actor: str,
                  reason: str | None, at: float) -> dict[str, Any] | None:
    """The asset event of a flip this task run made, added to `outlet_events`; returns its extra.

    `flipped` is the verb's word. A verb that found the alias already on `version` (no flip) emits
    nothing, unless the alias was moved there under this run's tag (`run_tag` in its reason): an
    earlier try of the task flipped it and its event was lost with that try. `outlet_events` is
    the task context's (None outside Airflow: the extra is still returned).
    """
    reg = k.registry
    rec = reg.get_alias(alias)
    ours = rec is not None and rec.version == version
    if not flipped:
        if not ours or run_tag not in (rec.reason or ""):
            return None
        log.info("alias %r was flipped to v%s by an earlier try of this run: announcing it now", alias, version)
    if ours:
        previous_version, at = rec.previous_version, rec.updated_at
    v = reg.get_version(pipeline, version)
    extra = {"pipeline": pipeline, "alias": alias, "action": action, "version": version,
             "previous_version": previous_version, "rules_version": v.rules_version, "rules_hash": v.rules_hash,
             "table": v.table_path, "actor": actor, "reason": reason, "at": at}
    asset = kappa_alias_asset(alias)
    if outlet_events is not None:
        outlet_events[FLIPS].add(asset, extra=extra)
    log.info("asset event on %s (%s): alias %s -> %s v%s (%s from %s by %s; rules %s)", asset.name, asset.uri, alias,
             pipeline, version, action, "nothing" if previous_version is None else f"v{previous_version}", actor,
             v.rules_version or "-")
    return extra


def flip_events(triggering_asset_events: Mapping[Any, Any] | None) -> list[dict[str, Any]]:
    """The kappa flips that triggered a downstream run, oldest first, each logged on one line.

    `triggering_asset_events` is the run's task context entry. Each flip: the alias's Asset name
    and URI, the flip's extra, and the run that flipped it (dag id, run id) and when.
    """
    out = []
    for asset in triggering_asset_events or {}:
        if not isinstance(asset, Asset) or not asset.name.startswith(ASSET_NAME_PREFIX):
            continue  # the same events are listed under the AssetAlias too
        for ev in triggering_asset_events[asset]:
            out.append({"asset": asset.name, "uri": asset.uri, "extra": dict(ev.extra or {}),
                        "source_dag_id": ev.source_dag_id, "source_run_id": ev.source_run_id,
                        "timestamp": ev.timestamp.isoformat()})
    out.sort(key=lambda f: f["timestamp"])
    for f in out:
        e = f["extra"]
        log.info("%s now serves %s v%s (was %s; %s by %s; rules %s, sha256 %s; table %s), flipped by %s run %s",
                 e.get("alias"), e.get("pipeline"), e.get("version"),
                 "nothing" if e.get("previous_version") is None else f"v{e['previous_version']}", e.get("action"),
                 e.get("actor"), e.get("rules_version") or "-", (e.get("rules_hash") or "-")[:12], e.get("table"),
                 f["source_dag_id"], f["source_run_id"])
    if not out:
        log.info("no kappa flip among the events that triggered this run")
    return out
