"""`deploy/dev.sh test` runs the suite as two pytest processes side by side: between them its two
halves must hold every test folder, each once, so that a new folder is never left out of CI."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def halves() -> dict[str, list[str]]:
    text = (ROOT / "deploy" / "dev.sh").read_text(encoding="utf-8")
    return {name: m.group(1).split() for name in ("FIRST_HALF", "SECOND_HALF")
            if (m := re.search(rf"^{name}=\((.*?)\)$", text, re.M))}


def test_the_two_halves_hold_every_test_folder_once():
    got = halves()
    assert set(got) == {"FIRST_HALF", "SECOND_HALF"}, got
    listed = got["FIRST_HALF"] + got["SECOND_HALF"]
    assert len(listed) == len(set(listed)), listed
    folders = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    covered = {f for f in folders if any(f == h or f.startswith(h + "/") for h in listed)}
    assert covered == folders, f"test folders in neither half of deploy/dev.sh: {sorted(folders - covered)}"
    assert all((ROOT / h).is_dir() for h in listed), listed
