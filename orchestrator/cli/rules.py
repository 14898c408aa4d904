"""`kappa rules preview|check|diff`: roll out standardization rules with confidence.

`preview` applies a rules version to the raw columns of the table a pipeline serves now and
shows, in seconds and before any reprocess, what would change (the validation report's change
section: rows changed per field, the most frequent changes). `check` validates rules files the
way `deploy` does, for CI: exit 0 and one `ok` line per file, or one error line per bad file
and exit 1. `diff` shows what changed between the rules two deployed versions run, as stored at
their deploys (`orchestrator.jobctl.version_rules`), whatever the files say now.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from orchestrator.cli.app import AsJson, app, cli_of, error_line, new_typer
from orchestrator.cli.render import print_json
from orchestrator.observe.render import render_preview
from orchestrator.core.exceptions import KappaError

__all__ = ["rules_app"]

rules_app = new_typer(help="Standardization rules: preview what a rules version would change, check rules files, "
                           "diff two versions' rules.")
app.add_typer(rules_app, name="rules")


@rules_app.command("preview")
def preview_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name (see `kappa pipelines`)")],
    rules: Annotated[str, typer.Option("--rules", help="rules version to preview, e.g. v2")],
    top: Annotated[int, typer.Option("--top", min=1, max=1000, help="most frequent changes shown per field")] = 10,
    as_json: AsJson = False,
) -> None:
    """Show what a rules version would change in the served table, without reprocessing anything."""
    from orchestrator.lifecycle.preview import preview_rules

    cli = cli_of(ctx)
    k = cli.kappa()
    result = preview_rules(k, k.pipeline(pipeline), rules, top=top)
    if as_json:
        print_json(result)
    else:
        render_preview(cli.out, result.model_dump(mode="json"))


def check_summary(path: Path, location: str | None = None) -> dict[str, Any]:
    """Validate one rules file as deploy does; its summary, or the deploy's RulesError.

    deploy finds a file by ruleset and version (`<rules location>/<ruleset>/<version>.toml`) and
    loads it with `load_rules`; a file inside that folder is found and named the same way here, so a
    version name deploy would refuse is refused too. Any other path is loaded as it is.
    """
    from jobs.lib.rules.files import load_rules, rules_path, rules_root

    resolved = path.resolve()
    in_tree = resolved.parent.parent == rules_root(location).resolve() and resolved.suffix == ".toml"
    rules = load_rules(rules_path(resolved.parent.name, resolved.stem, location) if in_tree else path)
    sections = {
        name: {"spellings": len(f.lookup), "regex": len(f.regex), "unmatched": f.unmatched}
        for name, f in rules.fields.items()
    }
    return {"file": str(path), "ok": True, "version": rules.version, "hash": rules.content_hash,
            "description": rules.description, "sections": sections}


@rules_app.command("check")
def check_cmd(
    ctx: typer.Context,
    files: Annotated[Optional[list[Path]], typer.Argument(help="rules files, e.g. jobs/rules/titles/v3.toml",
                                                          show_default=False)] = None,
    pipeline: Annotated[Optional[str], typer.Option("--pipeline", help="also check this pipeline's checks (their SQL "
                                                    "and columns), as deploy does")] = None,
    as_json: AsJson = False,
) -> None:
    """Validate rules files (and with --pipeline a pipeline's checks) with the errors of `kappa deploy` (for CI):
    exit 1 if any is bad."""
    results: list[dict[str, Any]] = []
    files = files or []
    if not files and pipeline is None:
        raise typer.BadParameter("name rules files to check, or --pipeline PIPELINE", param_hint="FILES")
    location = cli_of(ctx).settings().rules_location
    if pipeline is not None:
        from orchestrator.lifecycle.report import check_pipeline_checks

        k = cli_of(ctx).kappa()
        try:
            results.append({"pipeline": pipeline, "ok": True,
                            "checks": check_pipeline_checks(k, k.pipeline(pipeline))})
            if not as_json:
                typer.echo(f"ok: pipeline {pipeline}: {results[-1]['checks']}")
        except KappaError as e:
            results.append({"pipeline": pipeline, "ok": False, "error": str(e)})
            if not as_json:
                typer.echo(error_line(e), err=True)
    for path in files:
        try:
            results.append(check_summary(path, location))
        except KappaError as e:
            results.append({"file": str(path), "ok": False, "error": str(e)})
            if not as_json:
                typer.echo(error_line(e), err=True)
            continue
        if not as_json:
            r = results[-1]
            parts = "; ".join(f"[{name}] {s['spellings']} spellings, {s['regex']} regex rules"
                              for name, s in r["sections"].items())
            typer.echo(f"ok: {r['file']}: rules {r['version']} ({parts}), hash {r['hash'][:12]}")
    if as_json:
        print_json(results)
    if not all(r["ok"] for r in results):
        raise typer.Exit(1)


@rules_app.command("diff")
def diff_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name (see `kappa pipelines`)")],
    old: Annotated[str, typer.Argument(help="a deployed version, e.g. v1 or 1")],
    new: Annotated[str, typer.Argument(help="another deployed version, e.g. v2")],
    as_json: AsJson = False,
) -> None:
    """Show what changed between the rules two deployed versions run (as stored at their deploys)."""
    from orchestrator.jobctl.version_rules import rules_diff

    k = cli_of(ctx).kappa()
    spec = k.pipeline(pipeline)
    d = rules_diff(k.version(spec, _version(old, "OLD")), k.version(spec, _version(new, "NEW")))
    if as_json:
        print_json(d)
        return
    out = cli_of(ctx).out
    head = (f"rules of {d.pipeline} v{d.old_version} ({d.old_rules}, {d.old_hash[:12]}) and "
            f"v{d.new_version} ({d.new_rules}, {d.new_hash[:12]})")
    if d.same_content:
        out.print(f"{head}: same content" + (", formatting or comments differ" if d.diff else ""), highlight=False)
    else:
        out.print(f"{head}: the rules differ", highlight=False)
    for line in d.diff:
        style = "green" if line.startswith("+") and not line.startswith("+++") else (
            "red" if line.startswith("-") and not line.startswith("---") else None)
        out.print(line, style=style, highlight=False, markup=False)


def _version(text: str, what: str) -> int:
    """A version number written `3` or `v3`."""
    digits = text[1:] if text[:1] in ("v", "V") else text
    if not digits.isdigit() or int(digits) < 1:
        raise typer.BadParameter(f"{text!r} is not a version; write a version number such as 2 or v2", param_hint=what)
    return int(digits)
