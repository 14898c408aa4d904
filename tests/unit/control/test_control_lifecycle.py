"""Start/stop/inspect with fake job processes (the runtime's status/STOP contract, no Spark)."""

from __future__ import annotations

import json
import os
import re
import time

import psutil
import pytest

from control_helpers import ALIAS, KILL_BOUND, PIPELINE, allocate, fake_running, wait_for
from orchestrator.core.exceptions import LifecycleError
from orchestrator.jobctl import (STALE_HEARTBEAT_SECONDS, STARTUP_TIMEOUT_SECONDS, inspect_version, job_command,
                                 start_version, stop_version)


def _running(k, v):
    return wait_for(lambda: inspect_version(k.version(PIPELINE, v)).health == "running", 15, "the fake job to run")


def test_start_inspect_and_graceful_stop(k, fake_jobs):
    v = allocate(k).version
    res = start_version(k.version(PIPELINE, v), actor="tester", reason="unit")
    assert res.started and res.pid
    assert k.registry.get_version(PIPELINE, v).state == "starting"
    assert k.registry.get_version(PIPELINE, v).pid == res.pid
    _running(k, v)
    st = inspect_version(k.version(PIPELINE, v))
    assert st.alive and st.healthy and st.heartbeat_age < 5
    stop = stop_version(k.version(PIPELINE, v), actor="tester", reason="done", graceful_timeout=10)
    assert (stop.stopped, stop.how, stop.final_state) == (True, "graceful", "stopped")
    assert inspect_version(k.version(PIPELINE, v)).health == "stopped"
    assert k.registry.get_version(PIPELINE, v).state == "stopped"
    assert not k.paths(PIPELINE, v).stop_file.exists()
    log = k.paths(PIPELINE, v).log_file.read_text()
    assert "fake job starting" in log and "fake job stopped" in log
    actions = [(a.action, a.outcome) for a in k.registry.audit_log(PIPELINE)]
    assert ("start", "ok") in actions and ("stop", "ok") in actions


def test_starting_twice_is_a_noop_that_says_so(k, fake_jobs):
    v = allocate(k).version
    first = start_version(k.version(PIPELINE, v), actor="tester")
    second = start_version(k.version(PIPELINE, v), actor="tester")
    assert not second.started and second.pid == first.pid
    assert re.fullmatch(rf"{PIPELINE} v{v} is already running \(pid {first.pid}, (starting|running)\); "
                        r"not starting a second job", second.message)
    assert [a.outcome for a in k.registry.audit_log(PIPELINE, action="start")] == ["ok", "noop"]
    stop_version(k.version(PIPELINE, v), actor="tester", graceful_timeout=10)


def test_stop_escalates_to_sigterm_then_sigkill(k, fake_jobs):
    v1, v2 = allocate(k).version, allocate(k).version
    fake_jobs[v1] = "ignore-stop"
    fake_jobs[v2] = "ignore-term"
    start_version(k.version(PIPELINE, v1), actor="tester")
    start_version(k.version(PIPELINE, v2), actor="tester")
    _running(k, v1)
    _running(k, v2)
    s1 = stop_version(k.version(PIPELINE, v1), actor="tester", graceful_timeout=0.5, term_timeout=10)
    assert s1.how == "sigterm" and s1.final_state == "stopped"
    s2 = stop_version(k.version(PIPELINE, v2), actor="tester", graceful_timeout=0.5, term_timeout=0.5,
                      kill_timeout=KILL_BOUND)
    assert s2.how == "sigkill"
    assert not inspect_version(k.version(PIPELINE, v2)).alive


def test_a_job_killed_at_its_stop_bound_is_recorded_stopped_not_failed(k, fake_jobs, monkeypatch):
    """Issue 30, item 3: a job asked to stop that is still running at the bound (the pipeline's
    stop_timeout_seconds) is killed, and recorded `stopped`, killed at the bound, audited; never `failed`."""
    from orchestrator.cli.status import version_status
    from orchestrator.core.states import VersionState

    monkeypatch.setitem(k.pipelines, PIPELINE, k.pipeline(PIPELINE).model_copy(update={"stop_timeout_seconds": 0.5}))
    v = allocate(k).version
    fake_jobs[v] = "ignore-term"                     # takes neither the STOP file nor SIGTERM: only SIGKILL ends it
    start_version(k.version(PIPELINE, v), actor="tester")
    _running(k, v)
    k.registry.set_state(PIPELINE, v, VersionState.CAUGHT_UP, expected=VersionState.STARTING)
    res = stop_version(k.version(PIPELINE, v), actor="kappa-monitor", reason="standby grace period over", term_timeout=0.5,
                       kill_timeout=KILL_BOUND)
    assert (res.how, res.killed_at_bound, res.final_state, res.bound_seconds) == ("sigkill", True, "stopped", 0.5)
    assert res.message.startswith(f"stopped {PIPELINE} v{v} (pid {res.pid}) at its bound of 0.5 s: killed with "
                                  f"SIGKILL after "), res.message
    st = inspect_version(k.version(PIPELINE, v))
    assert (st.health, st.failed, st.alive) == ("stopped", False, False)
    assert k.registry.get_version(PIPELINE, v).state == "stopped"
    (stop,) = k.registry.audit_log(PIPELINE, action="stop", version=v)
    assert (stop.outcome, stop.details["how"], stop.details["killed_at_bound"], stop.details["bound_seconds"]) == \
        ("ok", "sigkill", True, 0.5)
    assert stop.details["ended"] == "killed at the stop's bound of 0.5 s (SIGKILL)"
    (requested,) = k.registry.audit_log(PIPELINE, action="stop_requested", version=v)
    assert requested.details["bound_seconds"] == 0.5
    row = version_status(k.version(PIPELINE, v), None)
    assert (row["state"], row["job"]["health"], row["job"]["error"]) == ("stopped", "stopped", None)
    assert k.registry.audit_log(PIPELINE, action="job_failed") == []


def test_a_crashed_job_is_failed_with_the_tail_of_its_log(k, fake_jobs):
    v = allocate(k).version
    fake_jobs[v] = "crash"
    start_version(k.version(PIPELINE, v), actor="tester", check_exit_seconds=0)
    st = wait_for(lambda: (s := inspect_version(k.version(PIPELINE, v))).failed and s, 10, "the crash")
    assert st.exit_code == 3
    assert "exited with code 3 (last state 'starting')" in st.error
    assert "fake job crashing: something broke" in st.log_tail


def test_a_job_that_dies_at_once_fails_the_start(k, fake_jobs):
    v = allocate(k).version
    fake_jobs[v] = "fail"
    with pytest.raises(LifecycleError, match=rf"the job of {PIPELINE} v{v} exited at once with code 1"):
        start_version(k.version(PIPELINE, v), actor="tester", check_exit_seconds=1.0)
    assert k.registry.get_version(PIPELINE, v).state == "failed"
    assert "RulesError: bad rule" in k.registry.get_version(PIPELINE, v).error


def test_a_hung_job_is_failed_by_its_stale_heartbeat(k, fake_jobs):
    v = allocate(k).version
    fake_jobs[v] = "hang"
    start_version(k.version(PIPELINE, v), actor="tester")
    _running(k, v)
    st = inspect_version(k.version(PIPELINE, v), stale_after=0.5, now=time.time() + 2)
    assert st.failed and st.alive and "heartbeat is" in st.error
    stop_version(k.version(PIPELINE, v), actor="tester", graceful_timeout=0.2, term_timeout=5)


@pytest.mark.parametrize("over", [-0.5, 0.5])
def test_the_stale_heartbeat_boundary_in_seconds(k, over):
    assert STALE_HEARTBEAT_SECONDS == 30.0
    v = allocate(k).version
    beat = 1_700_000_000.0   # whole seconds: beat + 29.5 is exact in floating point
    fake_running(k, v, heartbeat_at=beat)
    st = inspect_version(k.version(PIPELINE, v), now=beat + 30.0 + over)
    assert st.alive and st.heartbeat_age == 30.0 + over
    if over < 0:
        assert (st.health, st.error) == ("running", None)
    else:
        assert st.health == "failed" and st.error == (
            f"the job's heartbeat is 30 s old (limit 30 s): process {os.getpid()} is alive but not making "
            f"progress; see {k.paths(PIPELINE, v).log_file}")


@pytest.mark.parametrize("over", [-0.5, 0.5])
def test_the_startup_timeout_boundary_in_seconds(k, over):
    """A live process that has written no status.json yet is starting, for 180 s."""
    assert STARTUP_TIMEOUT_SECONDS == 180.0
    v = allocate(k).version
    created = psutil.Process().create_time()
    k.paths(PIPELINE, v).run_dir.mkdir(parents=True)
    k.paths(PIPELINE, v).launch_file.write_text(json.dumps({"pid": os.getpid(), "created": created,
                                                            "started_at": created}))
    st = inspect_version(k.version(PIPELINE, v), now=created + 180.0 + over)
    assert st.alive
    if over < 0:
        assert (st.health, st.error) == ("starting", None)
    else:
        assert st.health == "failed" and st.error == (
            f"the job process {os.getpid()} has written no status in 180 s; see {k.paths(PIPELINE, v).log_file}")


def test_a_reused_pid_is_not_taken_for_the_job(k):
    v = allocate(k).version
    fake_running(k, v)
    launch = k.paths(PIPELINE, v).launch_file
    data = json.loads(launch.read_text())
    data["started_at"] -= 3600  # the PID now belongs to a process started an hour later
    launch.write_text(json.dumps(data))
    st = inspect_version(k.version(PIPELINE, v))
    assert not st.alive and st.failed and f"process {os.getpid()} exited" in st.error


def test_the_launch_records_the_processs_creation_time(k, fake_jobs):
    v = allocate(k).version
    res = start_version(k.version(PIPELINE, v), actor="tester")
    launch = json.loads(k.paths(PIPELINE, v).launch_file.read_text())
    created = psutil.Process(res.pid).create_time()
    assert launch["pid"] == res.pid and launch["created"] == created and launch["started_at"] == created
    assert k.registry.get_version(PIPELINE, v).started_at == created
    stop_version(k.version(PIPELINE, v), actor="tester", graceful_timeout=10)


def test_the_launch_file_is_readable_by_its_owner_only(k, fake_jobs):
    """Its command line carries the Kafka config, secrets included."""
    v = allocate(k).version
    start_version(k.version(PIPELINE, v), actor="tester")
    try:
        assert k.paths(PIPELINE, v).launch_file.stat().st_mode & 0o777 == 0o600
    finally:
        stop_version(k.version(PIPELINE, v), actor="tester", graceful_timeout=10)


def test_a_recorded_creation_time_is_checked_to_the_second(k):
    v = allocate(k).version
    fake_running(k, v)
    launch = k.paths(PIPELINE, v).launch_file
    data = json.loads(launch.read_text())
    data["created"] = psutil.Process().create_time()
    launch.write_text(json.dumps(data))
    assert inspect_version(k.version(PIPELINE, v)).alive
    data["created"] += 2  # within the old launch files' 10 s, but not this process
    launch.write_text(json.dumps(data))
    st = inspect_version(k.version(PIPELINE, v))
    assert not st.alive and st.failed and f"process {os.getpid()} exited" in st.error


def test_stopping_the_serving_version_needs_force(k):
    v = allocate(k).version
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v, actor="t", reason="r")
    with pytest.raises(LifecycleError) as e:
        stop_version(k.version(PIPELINE, v), actor="tester")
    assert str(e.value) == (f"{PIPELINE} v{v} is serving alias '{ALIAS}': stopping its job would freeze the "
                            f"served table; promote or roll back to another version first, or pass force")


def test_stopping_a_version_that_is_not_running_says_so(k):
    v = allocate(k).version
    res = stop_version(k.version(PIPELINE, v), actor="tester")
    assert (res.stopped, res.how, res.message) == (False, "not-running", f"{PIPELINE} v{v} was not running")


def test_retired_version_cannot_start(k):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "retired")
    with pytest.raises(LifecycleError, match="is retired"):
        start_version(k.version(PIPELINE, v), actor="tester")


def test_job_command_local_and_spark_submit(k):
    v = allocate(k).version
    cmd, mode = job_command(k.version(PIPELINE, v))
    assert mode == "local" and cmd[1:3] == ["-m", "jobs.run"]
    assert cmd[cmd.index("--job") + 1] == "jobs.standardize:transform" and cmd[cmd.index("--key") + 1] == "member_id"
    assert cmd[cmd.index("--checkpoint") + 1] == str(k.paths(PIPELINE, v).checkpoint)
    assert cmd[cmd.index("--group-id") + 1] == f"kappa.{PIPELINE}.v{v}"
    assert cmd[cmd.index("--trigger") + 1] == "continuous"
    cmd, mode = job_command(k.version(PIPELINE, v), master="spark://127.0.0.1:7077")
    assert mode == "spark-submit" and cmd[0].endswith("bin/spark-submit")
    assert cmd[cmd.index("--master") + 1] == "spark://127.0.0.1:7077"
    assert cmd[cmd.index("--deploy-mode") + 1] == "client"
    assert any(c.endswith("jobs/run.py") for c in cmd)
    assert "spark.driver.host=127.0.0.1" in cmd
    # the driver JVM starts before the job's Python: Spark's Kafka connector and delta-spark on its command line
    jars = cmd[cmd.index("--jars") + 1].split(",")
    assert any("spark-sql-kafka" in j for j in jars) and any("delta-spark" in j for j in jars)
