"""What the commands print: JSON for scripts, tables and result lines for people.

JSON output is the verbs' typed results as `model_dump(mode="json")` gives them; the commands'
own views (status rows, pipelines) are built from JSON-ready values. Result lines follow one
shape for every changing verb: the checks it made, its message, then what it did (or, in a dry
run, would do).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.core.files import write_atomic
from orchestrator.observe.lag import fmt_lag
from orchestrator.observe.progress import fmt_count, fmt_eta
from orchestrator.observe.render import fmt_time

__all__ = ["JsonData", "history_table", "json_ready", "pipelines_table", "print_json", "print_result", "status_table",
           "to_json", "write_json"]

#: A typed result, a list of them, or JSON-ready values (dicts, lists, str, numbers, bool, None)
#: that may hold typed results.
JsonData = BaseModel | Sequence[BaseModel] | Mapping[str, Any] | Sequence[Any] | None


def json_ready(data: JsonData) -> Any:
    """`data` with every model as its `model_dump(mode="json")`, and non-finite floats as strings
    ("inf": a key-count ratio against an empty table): strict JSON has no infinity, and scripts parse
    strict JSON."""
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    if isinstance(data, float) and not math.isfinite(data):
        return str(data)
    if isinstance(data, dict):
        return {k: json_ready(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_ready(v) for v in data]
    return data


def to_json(data: JsonData) -> str:
    """`data` as indented strict JSON (non-ASCII kept as is)."""
    return json.dumps(json_ready(data), indent=2, ensure_ascii=False, allow_nan=False)


def print_json(data: JsonData) -> None:
    typer.echo(to_json(data))


def write_json(path: Path | None, data: JsonData) -> None:
    """Also keep `data` in the file `path` (a benchmark's `--out`), replaced atomically."""
    if path is not None:
        write_atomic(path, to_json(data) + "\n")


def print_result(console: Console, result: JsonData) -> None:
    """A verb's result for people: what it checked, its message, then what it did (or would do)."""
    d = json_ready(result)
    if not isinstance(d, dict):
        console.print(to_json(d), markup=False)
        return
    for check in d.get("checks") or []:
        mark = "ok" if check.get("ok") else "FAILED"
        console.print(f"check {check.get('name')}: {mark} - {check.get('detail')}", markup=False)
    msg = d.get("message")
    console.print(msg if msg else to_json(d), markup=False)
    label = "would" if d.get("dry_run") else "did"
    for action in d.get("actions") or []:
        console.print(f"  {label}: {action}", markup=False)
    for done in d.get("done") or []:
        console.print(f"  done: {done}", markup=False)
    for res in d.get("results") or []:
        if res.get("error"):
            console.print(f"  v{res.get('version')}: {res['error']}", markup=False)
        else:
            for action in res.get("actions") or []:
                console.print(f"  v{res.get('version')}: {label} {action}", markup=False)


def pipelines_table(pipelines_file: Path | str, data: list[dict[str, Any]]) -> Table:
    t = Table(title=f"pipelines ({pipelines_file})", title_justify="left")
    for col in ("pipeline", "job", "topics", "key", "rules", "alias", "serving", "versions"):
        t.add_column(col)
    for d in data:
        key = d.get("key")
        t.add_row(d["name"], str(d.get("job")), ", ".join(d.get("topics") or []),
                  ", ".join(key) if isinstance(key, list) else str(key),
                  ", ".join(d["rules_versions"]) or "-", str(d.get("alias")),
                  "-" if d["serving_version"] is None else f"v{d['serving_version']}", str(d["versions"]))
    return t


def status_table(data: list[dict[str, Any]]) -> Table:
    """`kappa status` for people: one row per version, `*` on the one the alias serves."""
    t = Table(title_justify="left")
    for col in ("pipeline", "version", "state", "readiness", "lag", "ETA", "rejects", "rules", "job"):
        t.add_column(col, justify="right" if col in ("lag", "rejects") else "left")
    for p in data:
        if not p["versions"]:
            t.add_row(p["pipeline"], "-", "no versions", "", "", "", "", "", "")
        for v in p["versions"]:
            jtext = _job_cell(v)
            job = v.get("job") or {}
            reading = job.get("reading") or {}
            if reading.get("records_total"):
                jtext += (f", reading micro-batch {reading.get('batch_id')}: {fmt_count(reading.get('records_read'))}"
                          f" of {fmt_count(reading['records_total'])} records")
            t.add_row(p["pipeline"], f"v{v['version']}" + (" *" if v["serving"] else ""), v["state"],
                      v.get("readiness") or "-",
                      "-" if v.get("readiness") is None else fmt_lag(v.get("lag"), floored=bool(v.get("lag_floored")),
                                                                     unread=v.get("unread")),
                      "-" if v.get("readiness") is None else fmt_eta(v.get("eta_seconds")),
                      "-" if v.get("rejects") is None else f"{v['rejects']:,}",
                      _rules_cell(v), jtext)
    t.caption = "* serves the pipeline's alias"
    edited = sorted({v["rules_version"] for p in data for v in p["versions"] if v.get("rules_file") == "changed"})
    if edited:
        t.caption += (f"; rules file edited since deploy: {', '.join(edited)} (each version runs the rules "
                      f"stored at its deploy; `kappa rules diff` compares versions, a new deploy takes the edit)")
    return t


def _job_cell(v: dict[str, Any]) -> str:
    """The job's health and PID; for a stopped version whose job still runs, the stop under way and
    who asked for it: 'stopping (pid 123, stop requested by airflow:scheduler 8 s ago)'."""
    job = v.get("job") or {}
    health = job.get("health", "-")
    bits = [f"pid {job['pid']}"] if job.get("pid") else []
    stop = v.get("stopping")
    if stop is not None:
        if health in ("starting", "running", "stopping"):
            health = "stopping"
        if stop.get("requested_by"):
            at = stop.get("requested_at")
            ago = "" if at is None else f" {fmt_eta(max(0.0, time.time() - at))} ago"
            bits.append(f"stop requested by {stop['requested_by']}{ago}")
    return health + (f" ({', '.join(bits)})" if bits else "")


def _rules_cell(v: dict[str, Any]) -> str:
    """The rules version, and how the file of that name compares with what the version runs."""
    name = v.get("rules_version") or "-"
    note = {"changed": "file edited since deploy", "missing": "file gone", "invalid": "file invalid now"}.get(
        v.get("rules_file") or "")
    return f"{name} ({note})" if note else name


def history_table(entries: list[dict[str, Any]]) -> Table:
    """The audit log for people, newest last as the registry returns it. Cells are text, never Rich markup:
    a reason's "[airflow kappa_promote run ...]" tag is shown as written."""
    t = Table(title_justify="left")
    for col in ("at", "action", "pipeline", "version", "actor", "outcome", "reason"):
        t.add_column(col)
    for e in entries:
        t.add_row(*(Text(cell) for cell in (
            fmt_time(e.get("at")), str(e.get("action")), str(e.get("pipeline") or "-"),
            "-" if e.get("version") is None else f"v{e['version']}", str(e.get("actor")), str(e.get("outcome")),
            str(e.get("reason") or ""))))
    return t
