"""The fault table of the closing note (issue 33): the rows the fault suite's tests record with the
`fault_row` fixture, gathered from their reports and written once the run ends."""

from __future__ import annotations

from pathlib import Path

#: The user property under which a test's report carries a row.
KEY = "fault_row"
COLUMNS = ("scenario", "phase", "fault", "kappa", "healed_s", "exact", "consistent")
HEADER = ("scenario", "phase", "fault injected", "what kappa did", "healed in (s)", "served table exact",
          "registry consistent")


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        cells = [str(r[c]) if c != "healed_s" else f"{r[c]:.1f}" for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write(terminalreporter, rows: list[dict], artifacts: Path) -> None:
    """Print the table after the run's summary and write it to `artifacts`/faults.md."""
    if not rows:
        return
    text = markdown(rows)
    terminalreporter.write_sep("=", "fault suite (issue 33)")
    terminalreporter.write(text)
    try:
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "faults.md").write_text(text)
    except OSError as e:
        terminalreporter.write_line(f"cannot write {artifacts / 'faults.md'}: {e}")
