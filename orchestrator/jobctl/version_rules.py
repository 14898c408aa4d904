"""The rules a version was deployed with: stored at deploy, used by every start of that version.

A version is one set of rules. At deploy the rules file is read once; the text that was validated
(and whose `Rules.content_hash` the registry records as the version's `rules_hash`) is stored in
the same registry transaction that allocates the version (`details["rules"]`: ruleset, version,
the file it came from, hash and text). Every start of the version (deploy, restart by the
supervisor, rollback to it, reconcile, a cluster executor's driver) writes that text to
`<run dir>/rules/<ruleset>/<version>.toml` and hands the job that file, after checking that it still
gives the recorded hash. The rules file as it is now is never read for a deployed version: an edit
after deploy changes nothing for it. `kappa status` says when the file of the same name differs
from what a version runs (`file_state`), and `kappa rules diff` compares two versions' stored rules.

A version deployed by a kappa that did not store rules has no stored text: it starts with the file
only while that file still gives the recorded hash, and is refused with what to do otherwise.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from orchestrator.core.exceptions import LifecycleError, NotFoundError, RulesError

if TYPE_CHECKING:
    from orchestrator.context import VersionRef

__all__ = ["DeployedRules", "FileState", "read_rules_file", "stored_rules", "deployed_rules", "materialize",
           "file_state", "rules_diff", "RulesDiff"]

FileState = Literal["same", "changed", "missing", "invalid"]


class DeployedRules(BaseModel):
    """The rules of one version: what the registry recorded, and the text it runs with."""

    pipeline: str
    version: int
    ruleset: str
    rules_version: str
    rules_hash: str
    text: str
    source: str              # the file the text was read from at deploy
    stored: bool             # False: a version from before kappa stored rules (text read from the file)


def read_rules_file(path: Path):
    """(Rules, text) of a rules file, validated from exactly the text returned."""
    from jobs.lib.rules.files import parse_rules, read_rules_text

    text = read_rules_text(path)
    return parse_rules(text, path), text


def stored_rules(plan: Any) -> dict[str, Any]:
    """The `details` entry a deploy plan's version stores: {"rules": {...}}, or {} without rules."""
    if not plan.rules_version or plan.rules_text is None:
        return {}
    return {"rules": {"ruleset": Path(plan.rules_file).parent.name, "version": plan.rules_version,
                      "file": plan.rules_file, "hash": plan.rules_hash, "text": plan.rules_text}}


def deployed_rules(v: VersionRef) -> DeployedRules | None:
    """The rules the version runs with (from its record as resolved); None for a version without rules.

    LifecycleError when a version from before stored rules has lost its file's content."""
    spec, rec, pipeline = v.spec, v.record, v.pipeline
    if not spec.ruleset or not rec.rules_version:
        return None
    entry = (rec.details or {}).get("rules")
    if isinstance(entry, dict) and isinstance(entry.get("text"), str):
        return DeployedRules(pipeline=pipeline, version=rec.version, ruleset=entry.get("ruleset") or spec.ruleset,
                             rules_version=rec.rules_version, rules_hash=rec.rules_hash or "", text=entry["text"],
                             source=str(entry.get("file") or ""), stored=True)
    from jobs.lib.rules.files import rules_path

    try:
        path = rules_path(spec.ruleset, rec.rules_version, v.settings.rules_location)
        rules, text = read_rules_file(path)
    except RulesError as e:
        raise LifecycleError(
            f"{pipeline} v{rec.version} was deployed before kappa stored each version's rules, and its rules "
            f"file cannot be used: {e}; restore rules {rec.rules_version} as deployed (hash "
            f"{(rec.rules_hash or '-')[:12]}) or deploy a new version") from None
    if rules.content_hash != rec.rules_hash:
        raise LifecycleError(
            f"{pipeline} v{rec.version} was deployed before kappa stored each version's rules, and {path} has "
            f"changed since (hash {rules.content_hash[:12]}, deployed with {(rec.rules_hash or '-')[:12]}); "
            f"starting it would run other rules under its name. Restore the file as deployed or deploy a "
            f"new version with the edited rules")
    return DeployedRules(pipeline=pipeline, version=rec.version, ruleset=spec.ruleset,
                         rules_version=rec.rules_version, rules_hash=rules.content_hash, text=text,
                         source=str(path), stored=False)


def materialize(v: VersionRef) -> Path | None:
    """Write the version's rules to its run dir and return that file, for one start of its job."""
    from jobs.lib.rules.files import parse_rules
    from orchestrator.core.files import write_atomic

    pipeline, rec = v.pipeline, v.record
    rules = deployed_rules(v)
    if rules is None:
        return None
    target = v.paths.run_dir / "rules" / rules.ruleset / f"{rules.rules_version}.toml"
    try:
        check = parse_rules(rules.text, target).content_hash
    except RulesError as e:
        raise LifecycleError(f"{pipeline} v{rec.version}: its stored rules no longer validate ({e}); "
                             f"deploy a new version") from None
    if check != rules.rules_hash:
        raise LifecycleError(f"{pipeline} v{rec.version}: its stored rules give hash {check[:12]}, the registry "
                             f"recorded {rules.rules_hash[:12]}; refusing to start it with other rules. Deploy a "
                             f"new version")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, rules.text)
    return target


def file_state(v: VersionRef, cache: dict | None = None) -> FileState | None:
    """How the rules file of the same name compares with what the version runs: "same", "changed"
    (edited since the deploy), "missing" or "invalid"; None for a version without rules."""
    from jobs.lib.rules.files import rules_path

    spec, rec = v.spec, v.record
    if not spec.ruleset or not rec.rules_version or not rec.rules_hash:
        return None
    key = (spec.ruleset, rec.rules_version)
    if cache is not None and key in cache:
        current = cache[key]
    else:
        try:
            path = rules_path(spec.ruleset, rec.rules_version, v.settings.rules_location)
        except RulesError:
            current = "missing"
        else:
            try:
                current = read_rules_file(path)[0].content_hash
            except RulesError:
                current = "invalid"
        if cache is not None:
            cache[key] = current
    if current in ("missing", "invalid"):
        return current
    return "same" if current == rec.rules_hash else "changed"


class RulesDiff(BaseModel):
    pipeline: str
    old_version: int
    new_version: int
    old_rules: str
    new_rules: str
    old_hash: str
    new_hash: str
    same_content: bool
    diff: list[str]


def rules_diff(older: VersionRef, newer: VersionRef) -> RulesDiff:
    """A unified diff of the rules two deployed versions of one pipeline run with (their stored texts)."""
    pipeline, old, new = older.pipeline, older.version, newer.version
    rules = [deployed_rules(older), deployed_rules(newer)]
    for r, d in zip((older, newer), rules):
        if d is None:
            raise NotFoundError(f"{pipeline} v{r.version} has no rules (pipeline {pipeline!r} uses no ruleset, or "
                                f"the version was deployed without one)")
    a, b = rules
    diff = list(difflib.unified_diff(a.text.splitlines(), b.text.splitlines(), lineterm="",
                                     fromfile=f"{pipeline} v{old} (rules {a.rules_version}, {a.rules_hash[:12]})",
                                     tofile=f"{pipeline} v{new} (rules {b.rules_version}, {b.rules_hash[:12]})"))
    return RulesDiff(pipeline=pipeline, old_version=old, new_version=new, old_rules=a.rules_version,
                     new_rules=b.rules_version, old_hash=a.rules_hash, new_hash=b.rules_hash,
                     same_content=a.rules_hash == b.rules_hash, diff=diff)
