"""The fault suite (issue 33): faults injected into the real stack at forced points, each followed
by an oracle on the served table and the registry once the fault heals.

Every scenario adds rows to the table of the closing note (`fault_row`): scenario, phase, the fault
injected, what kappa did, the seconds until healed, whether the served table is exact and the registry
consistent. A row travels with its test's report (so that a run split over pytest-xdist workers gathers
them all); the root conftest prints the table after the run (`-s` shows each row as it happens) and
writes it to `test-artifacts/faults.md` (tests/faults/fault_table.py).
"""

from __future__ import annotations

import pytest

from tests.faults.fault_table import COLUMNS, KEY


@pytest.fixture
def fault_row(request):
    """`fault_row(scenario=..., phase=..., fault=..., kappa=..., healed_s=..., exact=..., consistent=...)`
    records and prints one row of the fault table."""
    def add(**row):
        missing = [c for c in COLUMNS if c not in row]
        assert not missing, f"a fault row needs {missing}"
        row = {**row, "exact": "yes" if row["exact"] else "no", "consistent": "yes" if row["consistent"] else "no"}
        request.node.user_properties.append((KEY, row))
        print(f"\nFAULT | {row['scenario']} | {row['phase']} | {row['fault']} | {row['kappa']} | healed in "
              f"{row['healed_s']:.1f} s | exact {row['exact']} | consistent {row['consistent']}")
    return add
