"""Issue 32, part 2: a share applied to a real running process tree, every thread of it.

A child `python -c` with a few threads and a grandchild stands for a job (the JVM and its Python
workers); the nice value of every thread is read back from /proc/<pid>/task/<tid>/stat.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from control_helpers import PIPELINE, allocate
from orchestrator.core.shares import share_to_nice
from orchestrator.jobctl.priority import apply_share, job_processes, renice_processes, thread_nice
from orchestrator.jobctl.process import LAUNCH_ENV
from tests.waiting import wait_until

JOB = r"""
import subprocess, sys, threading, time
child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                          "[threading.Thread(target=time.sleep, args=(600,), daemon=True).start() for _ in range(2)]\n"
                          "time.sleep(600)"])
for _ in range(3):
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.fixture
def job():
    """A running 'job': a process with 4 threads and a child with 3; stopped by its PID."""
    proc = subprocess.Popen([sys.executable, "-c", JOB], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, LAUNCH_ENV: "launch-under-test"})
    child = int(proc.stdout.readline())
    wait_until(lambda: len(os.listdir(f"/proc/{proc.pid}/task")) >= 4 and len(os.listdir(f"/proc/{child}/task")) >= 3,
               timeout=20, what="the job's threads")
    try:
        yield proc, child
    finally:
        for pid in (child, proc.pid):
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        proc.wait(10)


def _nices(pids):
    return {(pid, tid): thread_nice(tid) for pid in pids for tid in map(int, os.listdir(f"/proc/{pid}/task"))}


def test_every_thread_of_the_process_and_its_descendants_gets_the_nice_value(job):
    proc, child = job
    mine = os.getpriority(os.PRIO_PROCESS, os.getpid())     # (0, or what the suite was started with)
    pids = job_processes(proc.pid)
    assert pids == sorted([proc.pid, child])
    res = renice_processes(pids, 7)
    nices = _nices(pids)
    assert len(nices) >= 7 and set(nices.values()) == {7}, nices
    assert res.threads == len(nices) and res.complete
    assert os.getpriority(os.PRIO_PROCESS, os.getpid()) == mine       # the caller is left alone


def test_raising_the_priority_back_works_with_cap_sys_nice_and_is_reported_refused_without(job):
    proc, child = job
    pids = job_processes(proc.pid)
    renice_processes(pids, 10)
    res = renice_processes(pids, 2)
    if os.geteuid() == 0:
        assert set(_nices(pids).values()) == {2} and not res.refused
    else:
        assert res.refused == pids and set(_nices(pids).values()) == {10}


def test_a_process_outside_the_tree_that_carries_the_launch_id_is_found(job):
    proc, child = job
    assert set(job_processes(None, "launch-under-test")) >= {proc.pid, child}
    assert proc.pid not in job_processes(None, "another-launch")


def test_apply_share_reaches_the_running_job_of_a_version(k, job):
    proc, child = job
    v = allocate(k).version
    paths = k.paths(PIPELINE, v)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    paths.launch_file.write_text(json.dumps({"pid": proc.pid, "created": psutil.Process(proc.pid).create_time(),
                                             "mode": "local", "launch_id": "launch-under-test",
                                             "started_at": time.time()}))
    k.registry.set_state(PIPELINE, v, "backfilling", pid=proc.pid)
    res = apply_share(k.version(PIPELINE, v), 0.25)
    assert res.nice == share_to_nice(0.25) == 6
    assert set(_nices([proc.pid, child]).values()) == {6} and res.complete


def test_apply_share_touches_nothing_when_the_recorded_pid_is_not_the_job(k):
    v = allocate(k).version
    paths = k.paths(PIPELINE, v)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    paths.launch_file.write_text(json.dumps({"pid": os.getpid(), "created": psutil.Process().create_time(),
                                             "mode": "local"}))
    k.registry.set_state(PIPELINE, v, "backfilling", pid=os.getpid())
    mine = os.getpriority(os.PRIO_PROCESS, os.getpid())
    res = apply_share(k.version(PIPELINE, v), 0.1)
    assert res.processes == [] and "this process" in res.errors[0]
    assert os.getpriority(os.PRIO_PROCESS, os.getpid()) == mine
