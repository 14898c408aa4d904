"""What a kappa DAG run says on its note: the first thing an operator reads on the run's page.

Airflow 3 shows a DAG run's note (Markdown, at most 1,000 characters) in the run's header (its first
line) and whole in a dialog. The Task SDK gives a task no call that sets its run's note, so kappa's
tasks set it through the REST API (`PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}`, body `{"note": ...}`).

Credentials, in this order:
- the Airflow connection `kappa_airflow_api` (type http; host: the API's base URL, e.g.
  `http://airflow:8080`; login and password of a user who may edit DAG runs);
- on kappa's own stack (`kappa airflow start`, `kappa up`), the simple auth manager's user and its
  password file, which Airflow's task processes see in their environment (`AIRFLOW__API__BASE_URL`,
  `AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS`, `..._PASSWORDS_FILE`).

Notes are advisory: without credentials, or when Airflow refuses, the task logs one warning and goes
on (the same text is in its log). The note kappa writes starts with `**kappa:**`; a note the operator
gave at trigger time is kept below kappa's text, under "Note at trigger".
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Iterable, Mapping

from orchestrator.core.times import utc_clock

__all__ = ["NOTE_LIMIT", "CONN_ID", "MARK", "compose", "report_md", "report_summary", "report_link", "next_step_md",
           "conf_md", "standby_md", "set_run_note", "REPORT_TASK"]

log = logging.getLogger("kappa.airflow")
NOTE_LIMIT = 1000          # Airflow's DagRunNote.content is String(1000); the API refuses longer notes
CONN_ID = "kappa_airflow_api"
MARK = "**kappa:** "
OPERATOR = "\n\n---\nNote at trigger: "
CELL = 40                  # characters of a value in a top-changes table
REPORT_TASK = "validation_report"   # kappa_reprocess's task whose log holds the whole report as text


def _cell(value: Any) -> str:
    text = "null" if value is None else str(value)
    text = text if len(text) <= CELL else text[:CELL - 1] + "…"
    return text.replace("|", "\\|").replace("\n", " ")


def _pct(x: Any) -> str:
    return f"{(x or 0) * 100:.2f} %"


def _verdict(ok: Any) -> str:
    return "ok" if ok else ("n/a" if ok is None else "FAILED")


def _keys(d: Mapping[str, Any]) -> str:
    """The key count with what it compared and what it left out: the figures agree with the percentage."""
    from orchestrator.observe.render import keys_compared

    if d.get("serving_version") is None:
        return f"{d.get('keys_new', 0):,} keys (nothing served yet)"
    return f"{keys_compared(d)}: {_pct(d.get('key_delta_ratio'))} off, {_verdict(d.get('key_count_ok'))}"


def report_summary(d: Mapping[str, Any]) -> str:
    """The report in one line, for a note's first line: keys, rows the new logic changed, rejects."""
    changed = "" if d.get("serving_version") is None else f"; {d.get('rows_changed', 0):,} rows changed"
    return (f"{_keys(d)}{changed}; {d.get('rejects', 0):,} rejects ({_pct(d.get('reject_rate'))}, "
            f"{_verdict(d.get('reject_rate_ok'))})")


def report_link(base_url: str | None, dag_id: str, run_id: str, task_id: str = REPORT_TASK) -> str:
    """The Airflow UI page of the task whose log holds the whole report (its tables, unclamped), from the
    root of the UI's host (the note is read there; a short link leaves room in its 1,000 characters)."""
    from urllib.parse import quote, urlparse

    root = urlparse(base_url or "").path.rstrip("/")
    return (f"{root}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe=':+')}"
            f"/tasks/{quote(task_id, safe='')}")


def report_md(d: Mapping[str, Any], top: int = 3) -> list[str]:
    """The validation report as Markdown lines below a note's first line (which has its key counts,
    `report_summary`): rejects and rows changed, then a small table of the top changes per field."""
    n, old = d.get("version"), d.get("serving_version")
    rejects = (f"{d.get('rejects', 0):,} rejects of {d.get('offsets_read', 0):,} records read "
               f"({_pct(d.get('reject_rate'))}, limit {_pct(d.get('max_reject_rate'))}, {_verdict(d.get('reject_rate_ok'))})")
    lines = [f"**Validation report of v{n}** (rules {d.get('rules_version') or '-'}): {rejects}."]
    if old is not None:
        by_col = ", ".join(f"{c}: {v:,}" for c, v in (d.get("changed_by_column") or {}).items())
        lines[0] = lines[0][:-1] + (
            f"; rows compared at the same input: {d.get('rows_same_input', d.get('rows_compared', 0)):,}, changed by "
            f"the new logic: **{d.get('rows_changed', 0):,}**" + (f" ({by_col})" if by_col else "")
            + (f"; input differs (not compared): {d['rows_input_differs']:,}" if d.get("rows_input_differs") else "")
            + ".")
        for col, changes in (d.get("top_changes") or {}).items():
            if changes and top > 0:
                lines += ["", f"Top changes of `{col}`:", "", f"| rows | v{old} | v{n} |", "|---:|---|---|"]
                lines += [f"| {c['count']:,} | {_cell(c['old'])} | {_cell(c['new'])} |" for c in changes[:top]]
    failed = [c for c in d.get("checks") or [] if not c.get("ok")]
    if failed:
        lines += ["", "Checks failed: " + "; ".join(f"{c['name']}: {c.get('detail')}" for c in failed)]
    return lines


def conf_md(conf: Mapping[str, Any]) -> list[str]:
    """A configuration JSON to paste into a trigger form's *Advanced options → Configuration JSON*."""
    return ["```json", json.dumps(dict(conf)), "```"]


def next_step_md(pipeline: str, version: int, base_url: str | None = None) -> list[str]:
    """How to promote a ready version: a link to kappa_promote, its form's values, the CLI line."""
    link = f"{(base_url or '').rstrip('/')}/dags/kappa_promote"
    return [f"To serve it: [open kappa_promote]({link}) → **Trigger** with a reason, or paste its configuration "
            f"JSON:", "", *conf_md({"pipeline": pipeline, "version": version}), "",
            f"Or: `kappa promote {pipeline} {version} --reason ...`"]


def standby_md(pipeline: str, previous: int, until: float, grace: float) -> str:
    """What happens to the version a promote replaced."""
    clock = utc_clock(until, date="never")
    return (f"v{previous} stays a running standby until {clock} (grace period {grace:.0f} s): kappa_rollback "
            f"flips back to it at once until then; kappa_monitor stops it after (or `kappa stop {pipeline} {previous}`), "
            f"and a rollback then restarts it from its checkpoint.")


def compose(head: str, body: Iterable[str] = (), *, operator_note: str | None = None,
            limit: int = NOTE_LIMIT) -> str:
    """The note: `**kappa:** head` first (the line the run's header shows), then the body, then the
    operator's own note; cut to Airflow's limit by dropping body lines from the end."""
    head = MARK + head.strip()
    tail = (OPERATOR + operator_note.strip()) if operator_note and operator_note.strip() else ""
    lines = list(body)
    cut = "… (cut to Airflow's 1,000-character note: the task's log has it all)"
    text = "\n\n".join([head, "\n".join(lines)]) if lines else head
    while len(text) + len(tail) > limit and lines:
        lines.pop()
        while lines and (not lines[-1].strip() or lines[-1].rstrip().endswith(":") or lines[-1].startswith("|---")
                         or lines[-1].startswith("| rows |")):
            lines.pop()       # a heading or a table head left without what it heads
        text = "\n\n".join([head, "\n".join(lines + [cut])])
    if len(text) + len(tail) > limit:
        text = text[:max(0, limit - len(tail) - 1)] + "…"
    return text + tail


def operator_part(note: str | None) -> str | None:
    """The operator's own note out of a run's note (kappa's text, if any, removed)."""
    if not note:
        return None
    if not note.startswith(MARK):
        return note
    return note.split(OPERATOR, 1)[1] if OPERATOR in note else None


def _client():
    """An AirflowClient for this Airflow, or None (see the module docstring for where credentials come from)."""
    from orchestrator.airflow.client import AirflowClient

    try:
        from airflow.sdk import Connection
        from airflow.sdk.exceptions import AirflowNotFoundException
        try:
            conn = Connection.get(CONN_ID)
            url = conn.host if "://" in (conn.host or "") else conn.get_uri().split("?")[0]
            return AirflowClient(url, conn.login or "", conn.password or "", timeout=10.0)
        except AirflowNotFoundException:
            pass
    except ImportError:
        pass
    url = os.environ.get("AIRFLOW__API__BASE_URL")
    users = os.environ.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "")
    pw_file = os.environ.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE")
    if not (url and users and pw_file):
        return None
    user = users.split(",")[0].split(":")[0].strip()
    try:
        with open(pw_file, encoding="utf-8") as f:
            password = json.load(f).get(user)
    except (OSError, ValueError):
        return None
    return AirflowClient(url, user, password, timeout=10.0) if password else None


def set_run_note(head: str, body: Iterable[str] = (), *, dag_id: str | None = None,
                 run_id: str | None = None) -> str:
    """Set this run's note (inside an Airflow task); returns the note. Never raises: see the module docstring."""
    dag_id = dag_id or os.environ.get("AIRFLOW_CTX_DAG_ID")
    run_id = run_id or os.environ.get("AIRFLOW_CTX_DAG_RUN_ID")
    body = list(body)
    if not (dag_id and run_id):
        return compose(head, body)
    try:
        client = _client()
        if client is None:
            log.warning("the run's note is not set (no Airflow connection %r and not kappa's own Airflow): %s",
                        CONN_ID, head)
            return compose(head, body)
        current = client.get_run(dag_id, run_id).get("note")
        note = compose(head, body, operator_note=operator_part(current))
        client.set_note(dag_id, run_id, note)
        return note
    except Exception as e:  # noqa: BLE001 -- advisory: a note never fails the task it describes
        log.warning("the run's note is not set (%s): %s", e, head)
        return compose(head, body)
