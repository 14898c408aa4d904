"""`kappa status` shows how far behind a version is in time, next to its lag in records."""

from __future__ import annotations

import json

from orchestrator.observe import lag as lag_mod

P = "standardize"


def test_status_shows_lag_seconds(run, seeded, monkeypatch):
    seeded.registry.set_state(P, 2, "caught_up")
    monkeypatch.setattr(lag_mod, "log_offsets", lambda k, topics, timeout=10.0: {("member_profiles", 0): (0, 90)})
    monkeypatch.setattr(lag_mod, "group_offsets", lambda k, g, topics, timeout=10.0: {})
    monkeypatch.setattr(lag_mod, "checkpoint_next_offsets", lambda path: ({("member_profiles", 0): 30}, 4))
    monkeypatch.setattr(lag_mod, "oldest_unread_age", lambda k, details, *, now, timeout: 42.0)
    result = run("status", P)
    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if "pipeline" in line and "lag" in line)
    assert header.index("lag") < header.index("behind") < header.index("ETA")
    row = next(line for line in result.stdout.splitlines() if "v2" in line)
    assert "60" in row and "42 s" in row
    v1 = next(line for line in result.stdout.splitlines() if "v1" in line)
    assert "42 s" not in v1                                   # stopped: no readiness, no lag shown

    d = json.loads(run("status", P, "--json").stdout)
    rows = {v["version"]: v for v in d["pipelines"][0]["versions"]}
    assert (rows[2]["lag"], rows[2]["lag_seconds"], rows[2]["catchup_seconds"]) == (60, 42.0, 60.0)
    assert rows[2]["catchup_rule"].startswith("lag <= 1,000 records and <= 60 s behind in 3 samples")
    assert rows[1]["lag_seconds"] is None
