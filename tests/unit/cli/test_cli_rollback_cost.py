"""`kappa rollback` says what the rollback costs before it waits (issue 22, item 5): an instant flip
to a running standby, or a restart from the checkpoint with the records to catch up, then the
catch-up's progress and the flip."""

from __future__ import annotations

import json
import re
from pathlib import Path

from orchestrator.lifecycle.promote import promote
from tests.unit.cli import test_cli_verbs as verbs
from tests.unit.control.control_helpers import ALIAS, PIPELINE, ready_version

ROWS = verbs.ROWS
bed = verbs.bed   # the CLI test bed: a home, a pipelines file, a fake log, fake jobs


def _pair(bed) -> tuple[int, int]:
    v1 = ready_version(bed.k, bed.fake_log, ROWS)
    promote(bed.k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(bed.k, bed.fake_log, ROWS)
    promote(bed.k.version(PIPELINE, v2), actor="alice", reason="second")
    return v1, v2


def test_rollback_to_a_running_standby_says_the_flip_is_instant(bed):
    v1, v2 = _pair(bed)
    result = bed.run("rollback", PIPELINE, "--actor", "bob", "--reason", "bad v2")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{PIPELINE} v{v1} still runs as a standby: the flip is instant (until "), lines
    assert lines[-1] == f"rolled back alias '{ALIAS}' from v{v2} to v{v1}"


def test_rollback_to_a_stopped_version_says_it_restarts_it_then_shows_the_catch_up(bed):
    v1, v2 = _pair(bed)
    paths = bed.k.paths(PIPELINE, v1)
    paths.launch_file.unlink()
    paths.status_file.unlink()                  # v1's job is gone (stopped after its grace period)
    bed.k.registry.set_state(PIPELINE, v1, "stopped")
    Path(paths.checkpoint).mkdir(parents=True)
    result = bed.run("rollback", PIPELINE, "--actor", "bob", "--reason", "bad v2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["restarted"] is True          # stdout stays JSON
    err = result.stderr.splitlines()
    assert err[0] == (f"{PIPELINE} v{v1} is not running (it is stopped): restarting it from its checkpoint, "
                      f"0 records to catch up. v{v2} serves until the flip.")
    assert any(re.match(rf"  {PIPELINE} v{v1}: lag +0 .*ready", line) for line in err[1:]), err
