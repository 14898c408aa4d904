"""The README's worked example of adding a verb ("Layers and the version handle") runs as printed: its
module is taken from the README, executed, and called with a version handle."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from control_helpers import PIPELINE, allocate, ready_version
from orchestrator.core.exceptions import RefusedError
from orchestrator.lifecycle.promote import promote

README = Path(__file__).resolve().parents[3] / "README.md"
ROWS = [("m1", "swe", "SWE", "Ada", 1)]


def _example_verb():
    blocks = re.findall(r"```python\n(# orchestrator/lifecycle/pause\.py\n.*?)```", README.read_text(encoding="utf-8"),
                        flags=re.S)
    assert len(blocks) == 1, "the README's worked example of a verb (orchestrator/lifecycle/pause.py) is missing"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md:pause.py", "exec"), namespace)   # noqa: S102 - our own README
    return namespace["pause"]


def test_the_readme_verb_example_checks_on_the_handle_and_acts(k, fake_log):
    pause = _example_verb()
    idle = allocate(k).version
    res = pause(k.version(PIPELINE, idle), actor="tester")
    assert (res.version, res.stopped, res.how) == (idle, False, "not-running")
    serving = ready_version(k, fake_log, ROWS)
    promote(k.version(PIPELINE, serving), actor="tester", reason="first")
    with pytest.raises(RefusedError, match=rf"{PIPELINE} v{serving} serves alias"):
        pause(k.version(PIPELINE, serving), actor="tester")
