"""Helpers of the seed-job integration tests: run a job's build(ctx) in-process, read its tables, and
compute expected results independently of the job code (plain json + datetime, no jobs.lib.source.events)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

from orchestrator.core.tables import read_table
from jobs.lib.runtime.args import parse_args
from jobs.lib.runtime.context import JobContext
from jobs.lib.runtime.status import Status

UTC = timezone.utc
QUERY_TIMEOUT_SECONDS = 600  # a guard against a hung query, not a timing assertion


def _key_of(job: str) -> str:
    """The key of the shipped pipeline that runs `job`."""
    from orchestrator.core.pipelines import load_pipelines

    return next(",".join(s.key_columns) for s in load_pipelines().values() if s.job == job)


class JobRun:
    """Paths and arguments of one pipeline version of a job, driven in-process on a shared session."""

    def __init__(self, root: Path, job: str, pipeline: str, bootstrap: str, topics: list[str], *,
                 max_records: int = 100_000, extra: dict | None = None, version: int = 1):
        self.job = job
        self.root = root
        self.output = root / "table"
        self.rejects = root / "table__rejects"
        self.checkpoint = root / "checkpoint"
        self.run_dir = root / "run"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.argv = [
            "--pipeline", pipeline, "--version", str(version), "--bootstrap-servers", bootstrap,
            "--topics", ",".join(topics), "--output", str(self.output), "--rejects", str(self.rejects),
            "--checkpoint", str(self.checkpoint), "--run-dir", str(self.run_dir),
            "--max-records-per-batch", str(max_records), "--trigger", "available-now",
            "--extra", json.dumps(extra or {}), "--job", f"jobs.{job}:transform", "--key", _key_of(job),
        ]
        self.progress: list[dict] = []

    def context(self, spark) -> JobContext:
        args = parse_args(self.argv)
        status = Status(self.run_dir / "status.json", args.pipeline, args.version, args.trigger)
        return JobContext(args, spark, status)

    def run_in_process(self, spark, transform) -> JobContext:
        """The job's contract function started by kappa's runner (`jobs.lib.contract.runner.start_job`), then
        the available-now query waited for; its exception fails the test."""
        from jobs.lib.contract.runner import start_job

        ctx = self.context(spark)
        query = start_job(ctx, f"jobs.{self.job}:transform", transform)
        try:
            query.awaitTermination(QUERY_TIMEOUT_SECONDS)
        finally:
            if query.isActive:
                query.stop()
                raise AssertionError(f"{self.job}: the available-now query was still running after "
                                     f"{QUERY_TIMEOUT_SECONDS}s")
        assert query.exception() is None, query.exception()
        self.progress = [json.loads(p.json) for p in query.recentProgress]
        for p in self.progress:
            ctx.on_progress(p)
        return ctx

    def table(self) -> list[dict]:
        return read_table(self.output).to_pylist()

    def rejected(self) -> list[tuple[str, int, int, str]]:
        rows = read_table(self.rejects).to_pylist()
        return sorted((r["topic"], r["partition"], r["offset"], r["error"]) for r in rows)


# -- Independent expectations ------------------------------------------------------------------

def ts(text: str) -> datetime | None:
    try:
        t = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return t.astimezone(UTC) if t.tzinfo else None


def doc(record) -> dict | None:
    """The record's JSON object, or None when the value is not one."""
    try:
        d = json.loads(record.value)
    except (TypeError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def key_text(record) -> str | None:
    try:
        return record.key.decode("utf-8") or None
    except (AttributeError, UnicodeDecodeError):
        return None


def valid_view(record) -> dict | None:
    d = doc(record)
    if not d or key_text(record) is None or ts(d.get("viewed_at")) is None:
        return None
    if not all(isinstance(d.get(f), str) for f in ("view_id", "member_id", "page")) or \
            d["member_id"] != key_text(record):
        return None
    return d


def expected_hourly(views) -> dict[tuple[str, datetime], int]:
    """(member_id, hour start) -> views, from the produced page-view records."""
    counts: Counter = Counter()
    for r in views:
        d = valid_view(r)
        if d:
            t = ts(d["viewed_at"])
            counts[(d["member_id"], t.replace(minute=0, second=0, microsecond=0))] += 1
    return dict(counts)


def valid_profile(record) -> dict | None:
    d = doc(record)
    if not d or not isinstance(d.get("name"), str):
        return None
    if d.get("member_id", key_text(record)) != key_text(record):
        return None
    if any(d.get(f) is not None and not isinstance(d[f], str)
           for f in ("title", "company", "location", "zip")):
        return None
    return d


def valid_settings(record) -> dict | None:
    d = doc(record)
    if not d or d.get("member_id", key_text(record)) != key_text(record):
        return None
    if d.get("language") is not None and not isinstance(d["language"], str):
        return None
    if d.get("email_notifications") is not None and not isinstance(d["email_notifications"], bool):
        return None
    if d.get("visibility") not in (None, "public", "connections", "private"):
        return None
    return d


def latest_per_key(records, validate) -> dict[str, tuple[dict | None, int]]:
    """member -> (latest valid value or None after a tombstone, its offset), in log order."""
    state: dict[str, tuple[dict | None, int]] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        member = key_text(r)
        if member is None:
            continue
        if r.value is None:
            state[member] = (None, r.offset)
            continue
        d = validate(r)
        if d is not None:
            state[member] = (d, r.offset)
    return state


def expected_joined(profiles, settings) -> dict[str, dict]:
    """member_id -> joined row: members with a profile; settings columns null when there are none."""
    prof = latest_per_key(profiles, valid_profile)
    sett = latest_per_key(settings, valid_settings)
    out = {}
    for member, (p, p_off) in prof.items():
        if p is None:
            continue
        s, s_off = sett.get(member, (None, None))
        out[member] = {
            "member_id": member, "name": p["name"], "title": p.get("title"), "company": p.get("company"),
            "location": p.get("location"), "zip": p.get("zip"),
            "language": s.get("language") if s else None,
            "email_notifications": s.get("email_notifications") if s else None,
            "visibility": s.get("visibility") if s else None,
            "profile_offset": p_off, "settings_offset": s_off if s else None,
        }
    return out


def expected_enriched(views, profiles) -> dict[str, str | None]:
    """view_id -> zip current at the view: records in timestamp order, a profile first on a tie."""
    zips: dict[str, str | None] = {}
    out = {}
    log = [(r.timestamp_ms, 0, r.offset, r) for r in profiles]
    log += [(r.timestamp_ms, 1, r.offset, r) for r in views]
    for _, kind, _, r in sorted(log, key=lambda x: x[:3]):
        if kind == 0:
            if key_text(r) is None:
                continue
            if r.value is None:
                zips.pop(key_text(r), None)
            elif (p := valid_profile(r)) is not None:
                zips[key_text(r)] = p.get("zip")
        elif (d := valid_view(r)) is not None:
            out[d["view_id"]] = zips.get(d["member_id"])
    return out


def expected_pairs(impressions, clicks, bound: timedelta) -> set[tuple[str, str]]:
    """(impression_id, click_id) of clicks at or after their impression and at most `bound` later."""
    shown = {}
    for r in impressions:
        d = doc(r)
        if d and d.get("impression_id") == key_text(r) and ts(d.get("shown_at")) and \
                all(isinstance(d.get(f), str) for f in ("ad_id", "member_id")):
            shown[d["impression_id"]] = ts(d["shown_at"])
    pairs = set()
    for r in clicks:
        d = doc(r)
        if not d or d.get("impression_id") != key_text(r) or not isinstance(d.get("click_id"), str):
            continue
        at = ts(d.get("clicked_at"))
        imp = shown.get(d["impression_id"])
        if at and imp and imp <= at <= imp + bound:
            pairs.add((d["impression_id"], d["click_id"]))
    return pairs


def by_member(rows) -> dict:
    out = defaultdict(list)
    for r in rows:
        out[r["member_id"]].append(r)
    return out
