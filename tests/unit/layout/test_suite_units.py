"""How the suite is split over pytest-xdist workers (tests/conftest.py): the tests that run a whole Airflow
stack are one unit of work, so no two Airflow stacks run side by side on the 2 cores."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import AIRFLOW_STACKS, LONG_FIRST, ONE_UNIT, unit_of

ROOT = Path(__file__).resolve().parents[3]


def _integration_modules_marked_airflow() -> list[str]:
    """The integration and fault test modules with the `airflow` mark (they start Airflow's processes, or run
    its DAGs beside the folder's stack)."""
    found = []
    for folder in ("integration", "faults"):
        for path in sorted((ROOT / "tests" / folder).rglob("test_*.py")):
            if "pytest.mark.airflow" in path.read_text(encoding="utf-8"):
                found.append(path.relative_to(ROOT).as_posix())
    return found


def test_the_walk_and_the_airflow_folder_are_one_unit():
    assert unit_of("tests/integration/cli/test_cli_up.py::test_kappa_up_then_reprocess_promote_and_roll_back_in_the_ui") \
        == AIRFLOW_STACKS
    assert unit_of("tests/integration/airflow/test_airflow_rest.py::test_x") == AIRFLOW_STACKS
    assert unit_of("tests/integration/cli/test_cli_demo.py::test_demo_end_to_end") == \
        "tests/integration/cli/test_cli_demo.py"
    assert unit_of("tests/integration/airflowish/test_a.py::t") == "tests/integration/airflowish/test_a.py"


def test_every_integration_module_marked_airflow_is_in_that_unit():
    modules = _integration_modules_marked_airflow()
    assert "tests/integration/cli/test_cli_up.py" in modules and len(modules) > 1, modules
    assert {unit_of(m) for m in modules} == {AIRFLOW_STACKS}, modules


def test_the_long_units_exist_and_the_airflow_stacks_start_first():
    assert LONG_FIRST[0] == AIRFLOW_STACKS
    for unit in LONG_FIRST:
        assert unit in ONE_UNIT or (ROOT / unit).is_file(), unit
    for prefixes in ONE_UNIT.values():
        for prefix in prefixes:
            assert (ROOT / prefix).exists(), prefix
