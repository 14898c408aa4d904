"""Trigger kappa's DAGs through Airflow's REST API and follow the run to its end.

What `kappa trigger reprocess|promote|rollback` calls. A token comes from `POST /auth/token`; the run
is created by `POST /api/v2/dags/{dag_id}/dagRuns` with `{"logical_date": null, "conf": {...}}`
(Airflow validates the conf against the DAG's Params and answers 400 naming the param); then the
run and its task instances are polled until the run finishes, and the logs of failed tasks are
fetched so that the caller can show why. Every refusal or unreachable server becomes one
AirflowError line that says what to do.
"""

from __future__ import annotations

import json

import time
from typing import Any, Callable, Iterable
from urllib.parse import quote

import requests
from pydantic import BaseModel, ConfigDict, computed_field

from orchestrator.core.exceptions import AirflowError

__all__ = ["AirflowClient", "TaskOutcome", "RunOutcome", "reprocess_conf", "promote_conf", "rollback_conf",
           "error_from_log", "follow", "trigger_and_follow"]

FINISHED = {"success", "failed"}


def _conf(**params: Any) -> dict[str, Any]:
    """A run conf with only the params given: the ones left out take the DAG's defaults."""
    return {k: v for k, v in params.items() if v is not None}


def reprocess_conf(pipeline: str, rules_version: str | None = None, *, reason: str,
                   threshold: int | None = None, auto_promote: bool | None = None,
                   grace_period_seconds: int | None = None, catchup_deadline_minutes: int | None = None) -> dict:
    """The conf of a kappa_reprocess run (param names as in dags/kappa_reprocess.py)."""
    return _conf(pipeline=pipeline, rules_version=rules_version, reason=reason, catchup_threshold=threshold,
                 auto_promote=auto_promote, grace_period_seconds=grace_period_seconds,
                 catchup_deadline_minutes=catchup_deadline_minutes)


def promote_conf(pipeline: str, version: int | None = None, *, reason: str,
                 grace_period_seconds: int | None = None) -> dict:
    """The conf of a kappa_promote run (version None: the newest caught-up version)."""
    return _conf(pipeline=pipeline, version=version, reason=reason, grace_period_seconds=grace_period_seconds)


def rollback_conf(pipeline: str, to_version: int | None = None, *, reason: str,
                  catchup_deadline_minutes: int | None = None) -> dict:
    """The conf of a kappa_rollback run (to_version None: the version served before the current one)."""
    return _conf(pipeline=pipeline, to_version=to_version, reason=reason,
                 catchup_deadline_minutes=catchup_deadline_minutes)


class TaskOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    task_id: str
    state: str | None
    try_number: int
    error: str | None = None  # the exception line from its log, when it failed
    log_tail: list[str] = []


class RunOutcome(BaseModel):
    """How a DAG run ended; its JSON form carries `ok` and `error` too."""

    model_config = ConfigDict(frozen=True)

    dag_id: str
    run_id: str
    state: str
    url: str  # the run in the Airflow UI
    conf: dict[str, Any]
    tasks: list[TaskOutcome]
    xcom: dict[str, Any] = {}  # return values of successful tasks

    @computed_field
    @property
    def ok(self) -> bool:
        return self.state == "success"

    @computed_field
    @property
    def error(self) -> str | None:
        """The first failed task's error: usually kappa's own message."""
        for t in self.tasks:
            if t.state == "failed":
                return f"task {t.task_id} failed: {t.error or 'see its log'}"
        return None if self.ok else f"run ended {self.state}"

    def raise_for_state(self) -> "RunOutcome":
        if not self.ok:
            raise AirflowError(f"{self.dag_id} run {self.run_id} {self.state}: {self.error} ({self.url})")
        return self


def _detail(resp: requests.Response) -> str:
    """The server's reason, on one line (Airflow appends the whole JSON schema to a param error)."""
    text = _raw_detail(resp).strip()
    return text.splitlines()[0] if text else resp.reason


def _raw_detail(resp: requests.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:300] or resp.reason
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):  # FastAPI validation errors
        return "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail
                         if isinstance(d, dict)) or str(detail)
    if isinstance(detail, dict):
        return detail.get("reason") or detail.get("message") or str(detail)
    return str(detail)


class AirflowClient:
    """A small client for the parts of Airflow 3's REST API that kappa uses."""

    def __init__(self, url: str, username: str, password: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.username = username
        self.password = password
        self.timeout = timeout
        self.session = requests.Session()
        self._token: str | None = None

    def _request(self, method: str, path: str, *, what: str, auth: bool = True, **kw) -> requests.Response:
        url = f"{self.url}{path}"
        headers = kw.pop("headers", {})
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        try:
            resp = self.session.request(method, url, headers=headers, timeout=kw.pop("timeout", self.timeout), **kw)
        except requests.ConnectionError:
            raise AirflowError(
                f"cannot reach Airflow at {self.url} ({what}): start it with `kappa airflow start` "
                f"or pass the right --airflow-url"
            ) from None
        except requests.Timeout:
            raise AirflowError(f"Airflow at {self.url} did not answer within {self.timeout:.0f}s ({what})") from None
        if resp.status_code == 401 and auth:
            raise AirflowError(f"Airflow at {self.url} refused the token of user {self.username!r} ({what}): "
                               f"{_detail(resp)}")
        if resp.status_code == 403:
            raise AirflowError(f"Airflow user {self.username!r} may not {what} at {self.url}: {_detail(resp)}")
        if resp.status_code == 404:
            raise AirflowError(f"Airflow at {self.url} has no such thing ({what}): {_detail(resp)}; check that "
                               f"the DAG id is right and that Airflow parsed kappa's dags/ folder (see the dag-processor log)")
        if resp.status_code == 400 or resp.status_code == 422:
            raise AirflowError(f"Airflow rejected the request to {what}: {_detail(resp)}")
        if resp.status_code >= 400:
            raise AirflowError(f"Airflow at {self.url} answered {resp.status_code} to {what}: {_detail(resp)}")
        return resp

    def token(self) -> str:
        if self._token is None:
            try:
                resp = self.session.post(f"{self.url}/auth/token",
                                         json={"username": self.username, "password": self.password},
                                         timeout=self.timeout)
            except requests.ConnectionError:
                raise AirflowError(f"cannot reach Airflow at {self.url} to log in: start it with "
                                   f"`kappa airflow start` or pass the right --airflow-url") from None
            except requests.Timeout:
                raise AirflowError(f"Airflow at {self.url} did not answer the login within {self.timeout:.0f}s") from None
            if resp.status_code in (401, 403):
                raise AirflowError(
                    f"Airflow at {self.url} refused the login of user {self.username!r} ({resp.status_code}): "
                    f"wrong user name or password; pass --airflow-user/--airflow-password "
                    f"(`kappa airflow start` sets up admin:admin)"
                )
            if not resp.ok:
                raise AirflowError(f"Airflow at {self.url} answered {resp.status_code} to the login of "
                                   f"{self.username!r}: {_detail(resp)}")
            try:
                self._token = resp.json()["access_token"]
            except (ValueError, KeyError):
                raise AirflowError(f"{self.url}/auth/token did not return an access token: is this Airflow 3?") from None
        return self._token

    def _dag(self, dag_id: str) -> str:
        return f"/api/v2/dags/{quote(dag_id, safe='')}"

    def get_dag(self, dag_id: str) -> dict:
        return self._request("GET", self._dag(dag_id), what=f"read DAG {dag_id}").json()

    def set_paused(self, dag_id: str, paused: bool) -> dict:
        return self._request("PATCH", self._dag(dag_id), json={"is_paused": paused},
                             what=f"{'pause' if paused else 'unpause'} DAG {dag_id}").json()

    def import_errors(self) -> list[dict]:
        return self._request("GET", "/api/v2/importErrors", what="list DAG import errors").json().get("import_errors", [])

    def wait_for_dags(self, dag_ids: Iterable[str], timeout: float = 120.0) -> None:
        """Return when every DAG in `dag_ids` is parsed; an import error of a kappa DAG file raises at once."""
        deadline = time.monotonic() + timeout
        dag_ids = list(dag_ids)
        missing = dag_ids
        while True:
            resp = self._request("GET", "/api/v2/dags", params={"limit": 100}, what="list DAGs")
            known = {d["dag_id"] for d in resp.json().get("dags", [])}
            missing = [d for d in dag_ids if d not in known]
            if not missing:
                return
            errors = [e for e in self.import_errors() if "kappa" in (e.get("filename") or "")]
            if errors:
                e = errors[0]
                raise AirflowError(f"Airflow cannot import {e.get('filename')}: "
                                   f"{(e.get('stack_trace') or '').strip().splitlines()[-1:]}")
            if time.monotonic() > deadline:
                raise AirflowError(f"Airflow at {self.url} has not parsed {', '.join(missing)} after "
                                   f"{timeout:.0f}s; check the dags folder and the dag-processor log")
            time.sleep(1.0)

    def trigger(self, dag_id: str, conf: dict, note: str | None = None) -> dict:
        body: dict[str, Any] = {"logical_date": None, "conf": conf}
        if note:
            body["note"] = note
        return self._request("POST", f"{self._dag(dag_id)}/dagRuns", json=body, what=f"trigger {dag_id}").json()

    def list_runs(self, dag_id: str, limit: int = 100) -> dict:
        """`{"dag_runs": [...], "total_entries": n}`, newest first."""
        return self._request("GET", f"{self._dag(dag_id)}/dagRuns", params={"limit": limit, "order_by": "-run_after"},
                             what=f"list the runs of {dag_id}").json()

    def get_run(self, dag_id: str, run_id: str) -> dict:
        return self._request("GET", f"{self._dag(dag_id)}/dagRuns/{quote(run_id, safe='')}",
                             what=f"read run {run_id} of {dag_id}").json()

    def set_note(self, dag_id: str, run_id: str, note: str) -> dict:
        """Replace a run's note (Markdown, at most 1,000 characters: Airflow refuses longer ones)."""
        return self._request("PATCH", f"{self._dag(dag_id)}/dagRuns/{quote(run_id, safe='')}", json={"note": note},
                             params={"update_mask": "note"}, what=f"set the note of run {run_id} of {dag_id}").json()

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        resp = self._request("GET", f"{self._dag(dag_id)}/dagRuns/{quote(run_id, safe='')}/taskInstances",
                             what=f"list the tasks of run {run_id}")
        return resp.json().get("task_instances", [])

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        resp = self._request(
            "GET", f"{self._dag(dag_id)}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}/xcomEntries/{key}",
            params={"deserialize": "true", "stringify": "false"}, what=f"read the result of {task_id}")
        return resp.json().get("value")

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> list[dict]:
        """The structured log events of one try (Airflow 3 answers JSON with Accept: application/json)."""
        resp = self._request(
            "GET", f"{self._dag(dag_id)}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"}, headers={"Accept": "application/json"},
            what=f"read the log of {task_id}")
        content = resp.json().get("content", [])
        return [c if isinstance(c, dict) else {"event": str(c)} for c in content]

    def set_connection(self, conn_id: str, conn_type: str, *, extra: dict | None = None, **fields: Any) -> None:
        """Create or replace an Airflow connection (host, port, login, password in `fields`).
        The password travels in the request body only, never in a URL or a log line."""
        body = {"connection_id": conn_id, "conn_type": conn_type, **fields,
                "extra": json.dumps(extra) if extra is not None else None}
        path = f"/api/v2/connections/{quote(conn_id, safe='')}"
        what = f"write connection {conn_id}"
        if self.session.get(f"{self.url}{path}", headers={"Authorization": f"Bearer {self.token()}"},
                            timeout=self.timeout).status_code == 200:
            self._request("PATCH", path, json=body, what=what)
        else:
            self._request("POST", "/api/v2/connections", json=body, what=what)

    def delete_connection(self, conn_id: str) -> None:
        self._request("DELETE", f"/api/v2/connections/{quote(conn_id, safe='')}", what=f"delete connection {conn_id}")

    def ui_run_url(self, dag_id: str, run_id: str) -> str:
        return f"{self.url}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def error_from_log(events: list[dict]) -> str | None:
    """The exception a task died of, as `Type: message`, from its structured log.

    kappa's tasks fail with AirflowFailException("ConflictError: ...") so that a refusal is not
    retried; the wrapper's name is dropped here.
    """
    for ev in reversed(events):
        for detail in ev.get("error_detail") or []:
            if isinstance(detail, dict) and detail.get("exc_type"):
                if detail["exc_type"] == "AirflowFailException" and detail.get("exc_value"):
                    return str(detail["exc_value"]).strip()
                return f"{detail['exc_type']}: {detail.get('exc_value', '')}".strip()
    for ev in reversed(events):
        if str(ev.get("level", "")).lower() in ("error", "critical") and ev.get("event"):
            return str(ev["event"])
    return None


def _log_line(ev: dict) -> str:
    ts = ev.get("timestamp", "")
    level = ev.get("level", "")
    return " ".join(str(x) for x in (ts, level, ev.get("event", "")) if x)


def follow(client: AirflowClient, dag_id: str, run_id: str, *, timeout: float, poll_seconds: float = 2.0,
           on_state: Callable[[str, dict[str, str | None]], None] | None = None,
           conf: dict | None = None) -> RunOutcome:
    """Poll the run until it finishes; `on_state(run_state, {task_id: state})` is called on every change."""
    deadline = time.monotonic() + timeout
    last: tuple | None = None
    while True:
        run = client.get_run(dag_id, run_id)
        tis = client.task_instances(dag_id, run_id)
        states = {t["task_id"]: t.get("state") for t in tis}
        snapshot = (run["state"], tuple(sorted(states.items(), key=lambda kv: kv[0])))
        if on_state is not None and snapshot != last:
            on_state(run["state"], states)
        last = snapshot
        if run["state"] in FINISHED:
            break
        if time.monotonic() > deadline:
            raise AirflowError(
                f"{dag_id} run {run_id} is still {run['state']} after {timeout:.0f}s "
                f"(tasks: {', '.join(f'{k}={v}' for k, v in states.items())}); follow it at "
                f"{client.ui_run_url(dag_id, run_id)}"
            )
        time.sleep(poll_seconds)
    tasks, xcom = [], {}
    for t in tis:
        task_id, state, tries = t["task_id"], t.get("state"), int(t.get("try_number") or 0)
        error, log_tail = None, []
        if state == "failed" and tries > 0:
            events = client.task_log(dag_id, run_id, task_id, tries)
            error = error_from_log(events)
            log_tail = [_log_line(e) for e in events[-20:]]
        elif state == "success":
            try:
                xcom[task_id] = client.xcom(dag_id, run_id, task_id)
            except AirflowError:
                pass  # a task without a return value has no XCom entry
        tasks.append(TaskOutcome(task_id=task_id, state=state, try_number=tries, error=error, log_tail=log_tail))
    return RunOutcome(dag_id=dag_id, run_id=run_id, state=run["state"], url=client.ui_run_url(dag_id, run_id),
                      conf=run.get("conf") or conf or {}, tasks=tasks, xcom=xcom)


def trigger_and_follow(url: str, user: str, password: str, dag_id: str, conf: dict, timeout: float = 1800.0,
                       on_state: Callable[[str, dict[str, str | None]], None] | None = None, *,
                       poll_seconds: float = 2.0, note: str | None = None) -> RunOutcome:
    """Trigger `dag_id` with `conf`, follow the run to its end and return its outcome.

    Raises AirflowError for a refused login (401), a conf that fails the DAG's Params (400, naming
    the param), an unknown DAG (404), an unreachable server, or a run still going after `timeout`.
    A run that ends failed is returned (`.ok` False, `.error` the failed task's exception):
    call `.raise_for_state()` to turn it into an AirflowError.
    """
    client = AirflowClient(url, user, password)
    dag = client.get_dag(dag_id)
    if dag.get("is_paused"):
        raise AirflowError(f"DAG {dag_id} is paused in Airflow at {url}, so a run would wait forever: unpause it "
                           f"in the UI or with `airflow dags unpause {dag_id}`")
    run = client.trigger(dag_id, conf, note=note)
    return follow(client, dag_id, run["dag_run_id"], timeout=timeout, poll_seconds=poll_seconds,
                  on_state=on_state, conf=conf)
