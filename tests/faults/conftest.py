"""The fault suite (issue 33): faults injected into the real stack at forced points, each followed
by an oracle on the served table and the registry once the fault heals.

Every scenario adds one row to the table of the closing note (`fault_row`): scenario, phase, the
fault injected, what kappa did, the seconds until healed, whether the served table is exact and the
registry consistent. The rows are printed after the run (`-s` shows each as it happens) and written
to `test-artifacts/faults.md`.
"""

from __future__ import annotations

import pytest

from tests.conftest import ARTIFACTS

_ROWS: list[dict] = []
COLUMNS = ("scenario", "phase", "fault", "kappa", "healed_s", "exact", "consistent")
HEADER = ("scenario", "phase", "fault injected", "what kappa did", "healed in (s)", "served table exact",
          "registry consistent")


def _markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        cells = [str(r[c]) if c != "healed_s" else f"{r[c]:.1f}" for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@pytest.fixture
def fault_row():
    """`fault_row(scenario=..., phase=..., fault=..., kappa=..., healed_s=..., exact=..., consistent=...)`
    records and prints one row of the fault table."""
    def add(**row):
        missing = [c for c in COLUMNS if c not in row]
        assert not missing, f"a fault row needs {missing}"
        row = {**row, "exact": "yes" if row["exact"] else "no", "consistent": "yes" if row["consistent"] else "no"}
        _ROWS.append(row)
        print(f"\nFAULT | {row['scenario']} | {row['phase']} | {row['fault']} | {row['kappa']} | healed in "
              f"{row['healed_s']:.1f} s | exact {row['exact']} | consistent {row['consistent']}")
    return add


def pytest_terminal_summary(terminalreporter):
    if not _ROWS:
        return
    text = _markdown(_ROWS)
    terminalreporter.write_sep("=", "fault suite (issue 33)")
    terminalreporter.write(text)
    try:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "faults.md").write_text(text)
    except OSError as e:
        terminalreporter.write_line(f"cannot write {ARTIFACTS / 'faults.md'}: {e}")
