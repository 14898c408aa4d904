"""Session-wide fixtures: real services on free loopback ports, stopped by their own PID.

Area-specific fixtures live in the conftest.py of each tests/<kind>/<area>/ folder.
"""

from __future__ import annotations

import logging
import os
import random
import uuid
import zlib
from pathlib import Path

import pytest

from jobs.lib.runtime.session import prepare_environment
from orchestrator.core.envvars import KAPPA_SPARK_JIT

prepare_environment()
# The suite's jobs read a few thousand records: their JVMs stop at C1 (KAPPA_SPARK_JIT), whose compiles cost
# less CPU than C2's would save there. (`kappa bench` keeps the full JIT: its default.)
os.environ.setdefault(KAPPA_SPARK_JIT, "quick")
# py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after
# pytest has closed its streams: noise after the summary line.
logging.getLogger("py4j").setLevel(logging.WARNING)

ARTIFACTS = Path(os.environ.get("KAPPA_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "test-artifacts"))


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


#: The SCRAM user of the session broker's SASL listener (its password is made per session).
SCRAM_USER = "kappa-test"


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """One embedded Apache Kafka broker for the whole session. Topics get unique names per test.

    It has a SASL/SCRAM listener beside the plaintext one, with the user `SCRAM_USER` and a
    password made for this session (`broker.scram_users`).
    """
    from orchestrator.dev.broker import EmbeddedBroker

    password = f"kappa-scram-{uuid.uuid4().hex}"
    b = EmbeddedBroker(tmp_path_factory.mktemp("broker"), scram_users={SCRAM_USER: password}).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def bootstrap(broker) -> str:
    return broker.bootstrap_servers


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One local[2] SparkSession shared by every in-process Spark test."""
    from jobs.lib.runtime.session import build_session

    local = tmp_path_factory.mktemp("spark-local")
    session = build_session("kappa-tests", local_dir=str(local))
    try:
        yield session
    finally:
        for q in session.streams.active:
            q.stop()
        session.stop()


SEED_ENV = "KAPPA_TEST_SEED"


def _seed_of(request) -> int:
    base = os.environ.get(SEED_ENV)
    if base is not None:
        return int(base)
    return (request.config.stash[_SESSION_SEED] ^ zlib.crc32(request.node.nodeid.encode())) % 2**31


@pytest.fixture
def seed(request) -> int:
    """The seed of this test's random data, logged so that a failure can be rerun with it.

    By default it varies from run to run (so that the data explores), derived from one session
    seed and the test's id; `KAPPA_TEST_SEED=<n>` fixes it. A failed test's report names the seed
    and the command that reruns it with the same data.
    """
    value = _seed_of(request)
    request.node.user_properties.append(("seed", value))
    print(f"seed={value} (rerun with {SEED_ENV}={value} pytest '{request.node.nodeid}')")
    return value


def _shared_seed(request) -> int:
    value = _seed_of(request)
    request.config.stash.setdefault(_SHARED_SEEDS, {})[(request.fixturename, request.node.nodeid)] = value
    print(f"seed={value} of the data shared by {request.node.nodeid or 'the session'} "
          f"(rerun with {SEED_ENV}={value})")
    return value


@pytest.fixture(scope="module")
def module_seed(request) -> int:
    """Like `seed`, for the random data a module-scoped fixture builds; a failed test's report names it."""
    return _shared_seed(request)


@pytest.fixture(scope="session")
def session_seed(request) -> int:
    """Like `seed`, for the random data a session-scoped fixture builds; a failed test's report names it."""
    return _shared_seed(request)


@pytest.fixture
def rng(seed) -> random.Random:
    """A `random.Random` seeded with this test's logged `seed`."""
    return random.Random(seed)


_SESSION_SEED = pytest.StashKey[int]()
_SHARED_SEEDS = pytest.StashKey[dict]()
#: The fault suite's table rows, in the order their tests reported (tests/faults/fault_table.py).
_FAULT_ROWS: list[dict] = []


def pytest_runtest_logreport(report):
    """Gathers the fault suite's rows from the reports (here, not in tests/faults, so that the process that
    writes the summary sees them when the run is split over pytest-xdist workers)."""
    from tests.faults.fault_table import KEY

    if report.when == "call":
        rows = [v for k, v in report.user_properties if k == KEY]
        if rows:
            _FAULT_ROWS.extend(rows)


def pytest_terminal_summary(terminalreporter):
    from tests.faults.fault_table import write

    if hasattr(terminalreporter.config, "workerinput"):
        return                                        # a pytest-xdist worker: the controller writes it
    write(terminalreporter, _FAULT_ROWS, ARTIFACTS)


def pytest_configure(config):
    config.stash[_SESSION_SEED] = random.SystemRandom().randrange(2**31)


def bound_of(item) -> float | None:
    """The test's bound in seconds, as pytest-timeout reads it: its ``timeout`` marker, else ``--timeout``,
    else ``PYTEST_TIMEOUT``, else the ``timeout`` ini value (None: no bound)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    else:
        value = item.config.getoption("timeout", None)
        if value is None:
            value = os.environ.get("PYTEST_TIMEOUT") or item.config.getini("timeout") or None
    return float(value) if value not in (None, "") else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test's waits end before its bound does (`tests.waiting.bound_test`): the bound starts with the
    test's set-up, as pytest-timeout's does."""
    from tests.waiting import bound_test

    bound_test(bound_of(item))


#: The tests that run a whole Airflow stack: tests/integration/airflow (its session stack, stopped after the
#: folder's last test) and `kappa up`'s walk (its own stack, with Chromium). One unit of work: one worker
#: runs them one after the other, never side by side. Side by side, two Airflow stacks and their jobs on
#: 2 cores stretched the walk from 450 s (alone) past its 900 s bound (CI, 2026-11-29).
AIRFLOW_STACKS = "tests/integration/airflow + tests/integration/cli/test_cli_up.py"
#: Units of work made of more than one file: each test whose path starts with one of the prefixes.
ONE_UNIT = {AIRFLOW_STACKS: ("tests/integration/airflow/", "tests/integration/cli/test_cli_up.py")}
#: The suite's units of work (`unit_of`) that take longest on this machine, started first: the README's
#: test command runs the suite on two pytest-xdist workers, each unit given whole to one worker in
#: collection order, and a long unit started last would leave the other worker idle at the end.
LONG_FIRST = (
    AIRFLOW_STACKS,
    "tests/faults/test_faults_network.py",
    "tests/integration/control/test_control_live.py",
    "tests/integration/control/test_control_supervision.py",
    "tests/faults/test_fault_broker_kill.py",
)


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file (its module-scoped fixtures are built once, and a
    module's tests that build on each other run in order), or the `ONE_UNIT` its path is in."""
    path = nodeid.split("::", 1)[0]
    return next((unit for unit, prefixes in ONE_UNIT.items() if path.startswith(prefixes)), path)


def pytest_collection_modifyitems(config, items):
    """Starts the longest units first; within a unit, and among the rest, the order is pytest's."""
    rank = {u: i for i, u in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(unit_of(item.nodeid), len(rank)))


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist hands each worker whole units of work (`unit_of`), in collection order. (Its own
    `--dist loadgroup` cannot do this with pytest 9: the group it appends to a node id is lost.)"""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return UnitScheduling(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if not report.failed:
        return report
    seeds = [v for k, v in item.user_properties if k == "seed"]
    if seeds:
        report.sections.append(("random data", f"seed={seeds[-1]}: rerun with "
                                               f"{SEED_ENV}={seeds[-1]} pytest '{item.nodeid}'"))
    shared = item.config.stash.get(_SHARED_SEEDS, {})
    for node in item.listchain():
        for fixture in ("module_seed", "session_seed"):
            value = shared.get((fixture, node.nodeid)) if fixture in item.fixturenames else None
            if value is not None:
                report.sections.append(("random data", f"seed={value} of the data shared by "
                                                       f"{node.nodeid or 'the session'}: rerun with "
                                                       f"{SEED_ENV}={value} pytest '{item.nodeid}'"))
    return report


@pytest.fixture
def unique():
    """A short unique suffix for topic, table and pipeline names."""
    return uuid.uuid4().hex[:10]


def _postgres_admin_url() -> str:
    return os.environ.get("KAPPA_TEST_POSTGRES_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="session")
def postgres_server_url():
    """URL of the machine's PostgreSQL (127.0.0.1:5432, trust auth). Fails, never skips, if absent."""
    import sqlalchemy as sa

    url = _postgres_admin_url()
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as c:
            c.execute(sa.text("select 1"))
    except Exception as e:
        pytest.fail(f"PostgreSQL is expected at {url} (set KAPPA_TEST_POSTGRES_URL to another): {e}")
    finally:
        engine.dispose()
    return url


@pytest.fixture
def postgres_url(postgres_server_url):
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    import sqlalchemy as sa

    name = "kappa_test_" + uuid.uuid4().hex[:12]
    admin = sa.create_engine(postgres_server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    base = postgres_server_url.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with admin.connect() as c:
            c.execute(sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"), {"n": name})
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def registry_url(request, tmp_path):
    """Each registry test runs on both databases."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    return request.getfixturevalue("postgres_url")
