"""`kappa throttle`: an operator changes a running backfill's share; refusals are one line and change nothing;
`kappa status` shows the share in force and its last changes."""

from __future__ import annotations

import json

from orchestrator.observe import lag as lag_mod

P = "standardize"


def _no_broker(monkeypatch):
    monkeypatch.setattr(lag_mod, "log_offsets", lambda k, topics, timeout=10.0: {("member_profiles", 0): (0, 90)})
    monkeypatch.setattr(lag_mod, "group_offsets", lambda k, g, topics, timeout=10.0: {})
    monkeypatch.setattr(lag_mod, "checkpoint_next_offsets", lambda path: ({("member_profiles", 0): 40}, 4))


def test_throttle_sets_a_fixed_share_then_adaptive_and_status_shows_it(run, seeded, monkeypatch):
    _no_broker(monkeypatch)
    seeded.registry.set_state(P, 2, "backfilling")
    result = run("throttle", P, "2", "--share", "0.3", "--actor", "ops", "--reason", "batch window")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{P} v2: share 1 -> 0.3 (nice 5), fixed; by ops")
    d = json.loads(run("throttle", P, "2", "--adaptive", "--actor", "ops", "--json").stdout)
    assert (d["from"], d["to"], d["mode"]) == (0.3, 0.3, "adaptive")

    row = {v["version"]: v for v in json.loads(run("status", P, "--json").stdout)["pipelines"][0]["versions"]}[2]
    assert (row["throttle"]["share"], row["throttle"]["mode"], row["throttle"]["nice"]) == (0.3, "adaptive", 5)
    assert [(c["to"], c["mode"], c["by"]) for c in row["throttle_changes"]] == [(0.3, "fixed", "ops"),
                                                                                (0.3, "adaptive", "ops")]
    monkeypatch.setenv("COLUMNS", "250")
    lines = run("status", P).stdout.splitlines()
    head = next(line for line in lines if "share 0.3" in line and "by ops" in line)
    assert head.strip().startswith(f"{P} v2 share 0.3 (nice 5), adaptive, since ") and head.endswith(": operator")
    assert any(line.strip().endswith("1 -> 0.3 (fixed, ops): operator: batch window") for line in lines)
    assert seeded.registry.audit_log(P, action="throttle")[-1].actor == "ops"


def test_throttle_refuses_with_one_line_and_changes_nothing(run, seeded):
    seeded.registry.set_state(P, 2, "backfilling")
    cases = [
        (("throttle", P, "1", "--share", "0.5"), 3, f"{P} v1 is stopped: only a version that runs and does not serve yet"),
        (("throttle", P, "2", "--share", "0"), 1, "must be in (0, 1]"),
        (("throttle", P, "2", "--share", "1.5"), 1, "must be in (0, 1]"),
        (("throttle", P, "2"), 1, "give either a share"),
        (("throttle", P, "9", "--share", "0.5"), 1, "has no version v9"),
        (("throttle", "nope", "2", "--share", "0.5"), 1, "unknown pipeline 'nope'"),
    ]
    for argv, code, words in cases:
        result = run(*argv)
        assert result.exit_code == code, (argv, result.output)
        err = result.stderr.strip()
        assert words in err and "\n" not in err and "Traceback" not in result.output, (argv, err)
    assert seeded.registry.audit_log(P, action="throttle") == []
    assert "throttle" not in (seeded.registry.get_version(P, 2).details or {})
