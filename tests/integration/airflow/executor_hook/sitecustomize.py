"""A test hook in the Airflow scheduler of the tests' stack (on its PYTHONPATH): it forces the interleaving
of apache/airflow#71172 (tests/integration/airflow/test_airflow_sensor_race.py). Inert unless the control
folder named by KAPPA_TEST_EXECUTOR_CTL holds one of its files, and outside the scheduler process (the
LocalExecutor's workers are forked from it, so they carry the patch).

- `env.json` ({name: value}): set in the environment of every workload a worker starts while the file
  exists (the Spark job a start_version task starts inherits it: the job hold hook of jobs.lib.sink.batches).
- `hold-report`: when a `wait_ready` workload returns, its worker creates `report-held` (the first such
  worker only) and reports its result to the scheduler only once `hold-report` is deleted.
- `hold-start`: a `wait_ready` workload picked up while `report-held` exists is started only once
  `hold-start` is deleted (its task instance stays queued); its worker creates `start-held` meanwhile.
No hold lasts more than HOLD_SECONDS.
"""

import json
import os
import time

CTL = os.environ.get("KAPPA_TEST_EXECUTOR_CTL")
HOLD_SECONDS = 180.0


def _hold(hold_name: str, marker_name: str, key: str) -> None:
    """While `hold_name` exists, and if this worker is the first to create `marker_name`: wait."""
    hold = os.path.join(CTL, hold_name)
    if not os.path.exists(hold):
        return
    try:
        fd = os.open(os.path.join(CTL, marker_name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    os.write(fd, key.encode())
    os.close(fd)
    deadline = time.monotonic() + HOLD_SECONDS
    while os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.05)


def _install() -> None:
    from airflow.executors.base_executor import BaseExecutor

    run_workload = BaseExecutor.run_workload

    def hooked(workload, **kwargs):
        key = str(getattr(workload, "key", "") or getattr(workload, "display_name", ""))
        sensor = "wait_ready" in key
        if sensor and os.path.exists(os.path.join(CTL, "report-held")):
            _hold("hold-start", "start-held", key)
        env_file = os.path.join(CTL, "env.json")
        extra = {}
        if os.path.exists(env_file):
            with open(env_file, encoding="utf-8") as f:
                extra = json.load(f)
        saved = {k: os.environ.get(k) for k in extra}
        os.environ.update(extra)
        try:
            code = run_workload(workload, **kwargs)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        if sensor:
            _hold("hold-report", "report-held", key)
        return code

    BaseExecutor.run_workload = staticmethod(hooked)


def _is_scheduler() -> bool:
    """`python -m airflow scheduler`: at this point sys.argv lacks the module's name, /proc has it all."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return False
    return b"airflow" in args and b"scheduler" in args


if CTL and _is_scheduler():
    _install()
