"""Showing what kappa found to a person on a terminal: the validation report and timestamps.

Both `kappa` (the CLI) and `kappa demo` print these, so they live below both front ends: the
CLI imports the dev tooling, never the other way round.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator.core.times import to_seconds, utc_clock
from orchestrator.observe.progress import fmt_count

__all__ = ["fmt_time", "render_report", "render_preview"]


def fmt_time(value: datetime | float | int | str | None) -> str:
    """A timestamp (datetime, naive meaning UTC; epoch seconds; ISO text) as kappa's one clock
    (`core.times.utc_clock`: '2025-05-01 12:05:01 UTC'); '-' for None, other text as it is."""
    if value is None:
        return "-"
    at = to_seconds(value)
    return str(value) if at is None else utc_clock(at)


def keys_compared(report: Mapping[str, Any]) -> str:
    """The report's phrase of the key counts (`Report.keys_compared`); of a report saved before it had one,
    the counts."""
    return report.get("keys_compared") or (f"{fmt_count(report.get('keys_new'))} keys in v{report.get('version')}, "
                                           f"{fmt_count(report.get('keys_serving'))} in v{report.get('serving_version')}")


def _verdict(ok: Any) -> str:
    return "-" if ok is None else ("[green]ok[/]" if ok else "[red]OVER THE LIMIT[/]")


def render_report(console: Console, report: BaseModel | Mapping[str, Any] | None) -> None:
    """The validation report, for people: key counts, rejects, and what the new rules changed."""
    if not report:
        return
    if isinstance(report, BaseModel):
        report = report.model_dump(mode="json")
    pipeline, n, old = report.get("pipeline"), report.get("version"), report.get("serving_version")
    rules = report.get("rules_version") or "-"
    head = f"validation report: {pipeline} v{n} (rules {rules})"
    if old is not None:
        head += f" against serving v{old} (rules {report.get('serving_rules_version') or '-'})"
    console.print(f"[bold]{head}[/]", highlight=False)

    if old is None:
        console.print(f"  keys: {fmt_count(report.get('keys_new'))} (nothing served yet to compare with)",
                      highlight=False)
    else:
        ratio = report.get("key_delta_ratio")
        ratio_s = f"{ratio:.2%}" if isinstance(ratio, (int, float)) else str(ratio)
        console.print(f"  keys: {escape(keys_compared(report))}: difference {ratio_s}, tolerance "
                      f"{report.get('key_count_tolerance', 0):.2%} {_verdict(report.get('key_count_ok'))}",
                      highlight=False)
    console.print(f"  rejects: {fmt_count(report.get('rejects'))} of {fmt_count(report.get('offsets_read'))} records "
                  f"read ({report.get('reject_rate', 0):.2%}, limit {report.get('max_reject_rate', 0):.2%}) "
                  f"{_verdict(report.get('reject_rate_ok'))}", highlight=False)
    if old is not None:
        _render_changes(console, report, n, old)
    for c in report.get("checks") or []:
        if not c.get("builtin"):
            console.print(f"  check {c['name']}{' (watched)' if c.get('watch') else ''}: {c['detail']} "
                          f"{_verdict(c.get('ok'))}", highlight=False)
    for problem in report.get("problems") or []:
        console.print(f"  [red]problem:[/] {problem}", highlight=False)
    if report.get("path"):
        console.print(f"  [dim]saved to {report['path']}[/]", highlight=False)


def _render_changes(console: Console, report: Mapping[str, Any], n: Any, old: Any) -> None:
    """What the new rules changed in the rows both versions hold, and the most frequent changes."""
    by_col = ", ".join(f"{c}: {fmt_count(v)}" for c, v in (report.get("changed_by_column") or {}).items())
    console.print(f"  rows compared (keys in both): {fmt_count(report.get('rows_compared'))}; changed by the "
                  f"new rules: [bold]{fmt_count(report.get('rows_changed'))}[/]" + (f" ({by_col})" if by_col else ""),
                  highlight=False)
    if report.get("aligned"):
        console.print(f"  compared at the same input (the same Kafka record): {fmt_count(report.get('rows_same_input'))} "
                      f"rows", highlight=False)
    if report.get("rows_input_differs"):
        console.print(f"  rows whose input differs (live updates one version has read and the other not "
                      f"yet; not compared): {fmt_count(report.get('rows_input_differs'))}", highlight=False)
    for label, key in (("added", "columns_added"), ("removed", "columns_removed")):
        if report.get(key):
            console.print(f"  columns {label}: {', '.join(report[key])}", highlight=False)
    for col, (a, b) in (report.get("columns_retyped") or {}).items():
        console.print(f"  column retyped: {col} {a} -> {b}", highlight=False)
    lost = report.get("keys_lost_to_compaction") or 0
    if lost:
        console.print(f"  keys lost to compaction: {fmt_count(lost)} (v{old} serves them; their latest record is "
                      f"malformed and the log no longer holds their earlier value, so no reprocess can derive them; "
                      f"not counted in the key-count check)", highlight=False)
    only_new, only_old = report.get("keys_only_new") or 0, report.get("keys_only_serving") or 0
    skew_new, skew_old = report.get("keys_only_new_skewed") or 0, report.get("keys_only_serving_skewed") or 0
    if only_new or only_old:
        skew = (f" ({fmt_count(skew_new)} and {fmt_count(skew_old)} of them input skew, left out of the key count)"
                if skew_new or skew_old else "")
        console.print(f"  keys only in v{n}: {fmt_count(only_new)}, only in v{old}: {fmt_count(only_old)}{skew}",
                      highlight=False)
    for col, changes in (report.get("top_changes") or {}).items():
        if not changes:
            continue
        t = Table(title=f"top changes of {col}: v{old} -> v{n}", title_justify="left")
        t.add_column("rows", justify="right")
        t.add_column(f"v{old}")
        t.add_column(f"v{n}")
        for ch in changes:
            t.add_row(f"{ch['count']:,}", str(ch["old"]), str(ch["new"]))
        console.print(t)


def render_preview(console: Any, p: dict[str, Any]) -> None:
    """The preview for people: what was read, then the validation report's change lines and tables."""
    served = f"served v{p['serving_version']} (rules {p.get('serving_rules_version') or '-'})"
    console.print(f"[bold]rules preview: {p['pipeline']} rules {p['rules_version']} against {served}, "
                  f"alias {p['alias']}[/]", highlight=False)
    console.print(f"  table {p['table']} (Delta version {p['delta_version']}): {fmt_count(p['rows_compared'])} "
                  f"rows read and compared in {p['seconds']:.2f} s", highlight=False)
    by_col = ", ".join(f"{c}: {fmt_count(v)}" for c, v in p["changed_by_column"].items())
    console.print(f"  rows the new rules would change: [bold]{fmt_count(p['rows_changed'])}[/]"
                  + (f" ({by_col})" if by_col else ""), highlight=False)
    if p.get("serving_rules_hash") == p["rules_hash"]:
        console.print(f"  rules {p['rules_version']} have the same content as the served version's rules",
                      highlight=False)
    old = f"v{p['serving_version']} now"
    for col, changes in p["top_changes"].items():
        if not changes:
            continue
        t = Table(title=f"top changes of {col}: {old} -> rules {p['rules_version']}", title_justify="left")
        t.add_column("rows", justify="right")
        t.add_column(old)
        t.add_column(f"rules {p['rules_version']}")
        for ch in changes:
            t.add_row(f"{ch['count']:,}", str(ch["old"]), str(ch["new"]))
        console.print(t)
