"""`kappa demo` end to end as a subprocess: the story it tells, the system it leaves, and no process left.

The demo runs on the real embedded stack (Apache Kafka, local Spark jobs, Delta tables, SQLite registry)
in the test's own home. Sizes are smaller than the demo's defaults to keep the suite's time
reasonable; the flow is the same. A second test interrupts the demo with SIGINT (Ctrl-C) while
its first job runs and checks that the cleanup still stops everything by PID.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from orchestrator.core.files import read_json
from orchestrator.observe.lagplot import is_png
from tests.pipelines import patient_pipelines_file
from tests.waiting import wait_until
from tests.shell import users_env

KAPPA = [sys.executable, "-m", "orchestrator.cli"]
DEMO_TIMEOUT = 1500  # seconds; on an idle 2-core machine it takes a few minutes at most
SMALL = ["--records", "10000", "--keys", "3000", "--rate", "10"]
TINY = ["--records", "1000", "--keys", "100", "--rate", "5"]  # interrupted while v1 runs: the size does not matter


def _env() -> dict[str, str]:
    env = users_env()
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _stopped_pids(out: str) -> dict[str, int]:
    return {what: int(pid) for what, pid in re.findall(r"^stopped (.+?) \(pid (\d+)\)$", out, re.M)}


def _gone(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _group_gone(pgid: int) -> bool:
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.info["pid"]) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                return False
        except (ProcessLookupError, psutil.Error):
            continue
    return True


@pytest.mark.integration
def test_demo_end_to_end(tmp_path, artifacts_dir):
    home = tmp_path / "demo-home"
    t0 = time.monotonic()
    pipelines = patient_pipelines_file(tmp_path / "pipelines.toml")   # CI saw v2 70 s behind, never ready
    proc = subprocess.run([*KAPPA, "--pipelines-file", str(pipelines), "demo", "--home", str(home), *SMALL],
                          capture_output=True, text=True, timeout=DEMO_TIMEOUT, env=_env())
    elapsed = time.monotonic() - t0
    (artifacts_dir / "demo-output.txt").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    print(f"kappa demo took {elapsed:.0f} s; output in {artifacts_dir / 'demo-output.txt'}")
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-4000:]}\n{proc.stderr[-4000:]}"

    # the story, section by section
    for header in ("1. The embedded stack", "2. A compacted topic of member profiles, and live updates",
                   "3. Deploy v1 with the v1 rules", "4. Deploy v2 with the v2 rules while updates keep arriving",
                   "5. Validation report: what the v2 rules change", "6. Promote v2: served rows before and after",
                   "7. Roll back to v1, then forward to v2 again", "8. The catch-up curve", "9. Audit log",
                   "10. Stopping everything the demo started"):
        assert header in out, header
    assert "cleanup.policy=compact" in out
    assert re.search(r"produced 10,000 records", out)
    assert "embedded broker (Apache Kafka, KRaft, log cleaner on)" in out
    # the cleaner compacts the topic before v1 reads it (the demo's topic settings, a live producer)
    flat = re.sub(r"\s+", " ", out)    # rich wraps long lines at the console's width
    m = re.search(r"the topic holds ([\d,]+) records so far; waiting for the log cleaner.*?compacted: ([\d,]+) "
                  r"records readable now, of ([\d,]+) written", flat)
    assert m, out[:3000]
    written, after = int(m[1].replace(",", "")), int(m[2].replace(",", ""))
    assert m[1] == m[3] and written >= 10_000 and after < written
    assert re.search(r"standardize v2: lag +[\d,]+ \(", out), "no lag line of v2"
    assert "promoted standardize v1: alias 'member_profiles_std' moved from nothing to v1" in out
    assert "validation report: standardize v2 (rules v2) against serving v1 (rules v1)" in out
    assert re.search(r"changed by the new rules: [1-9][\d,]*", out)
    assert "top changes of title: v1 -> v2" in out
    assert "promoted standardize v2: alias 'member_profiles_std' moved from v1 to v2" in out
    assert "alias member_profiles_std -> standardize v1 (before the promote)" in out
    assert "alias member_profiles_std -> standardize v2 (after the promote)" in out
    assert "rolled back alias 'member_profiles_std' from v2 to v1" in out
    assert "rolled back alias 'member_profiles_std' from v1 to v2" in out
    assert "demo finished in" in out

    # what it left: a registry, the pointer, the plot; the alias serves v2 again
    from orchestrator.registry import Registry

    reg = Registry(f"sqlite:///{home / 'registry.db'}")
    try:
        alias = reg.get_alias("member_profiles_std")
        assert (alias.version, alias.published_version) == (2, 2)
        actions = [(e.action, e.version, e.outcome) for e in reg.audit_log("standardize", limit=None)
                   if e.action in ("promote", "rollback")]
        assert actions == [("promote", 1, "ok"), ("promote", 2, "ok"), ("rollback", 1, "ok"), ("rollback", 2, "ok")]
        assert reg.lag_samples("standardize", 2, limit=None)
    finally:
        reg.close()
    pointer = json.loads((home / "warehouse" / "_aliases" / "member_profiles_std.json").read_text())
    assert pointer["version"] == 2 and pointer["table"].endswith("/standardize/v2")
    assert is_png(home / "catchup.png")
    (artifacts_dir / "demo-catchup.png").write_bytes((home / "catchup.png").read_bytes())

    # nothing left running: the PIDs it reports, and the jobs' process groups (JVM, Python workers)
    stopped = _stopped_pids(out)
    assert set(stopped) == {"standardize v1 job", "standardize v2 job", "broker"}, stopped
    for what, pid in stopped.items():
        assert _gone(pid), f"{what} (pid {pid}) still runs"
    for what in ("standardize v1 job", "standardize v2 job"):
        assert _group_gone(stopped[what]), f"processes of {what}'s group still run"
    assert "nothing left running (checked pids: " in out
    assert not (home / "broker.json").exists()


@pytest.mark.integration
def test_demo_interrupted_stops_everything(tmp_path):
    home = tmp_path / "demo-home"
    proc = subprocess.Popen([*KAPPA, "demo", "--home", str(home), *TINY], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 600
        for line in proc.stdout:
            lines.append(line)
            if re.search(r"deployed standardize v1 .*pid \d+", line):
                break
            assert time.monotonic() < deadline, "the demo did not deploy v1 in time"
        else:
            pytest.fail("the demo's output ended before it deployed v1:\n" + "".join(lines)[-3000:])
        assert proc.poll() is None, "".join(lines)

        def v1_job_running() -> bool:   # its query runs: the interrupt comes while the job works
            assert proc.poll() is None, "the demo exited before its v1 job ran:\n" + "".join(lines)[-3000:]
            statuses = [read_json(f) for f in home.rglob("status.json")]
            return any((st.get("pipeline"), st.get("version"), st.get("state")) == ("standardize", 1, "running")
                       for st in statuses if st)

        wait_until(v1_job_running, "the v1 job's status.json to say 'running'", 600, poll=0.5)
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines) + rest
    assert proc.returncode == 130, f"{out[-3000:]}\n{err[-3000:]}"
    assert "Stopping everything the demo started (it did not finish)" in out
    stopped = _stopped_pids(out)
    assert set(stopped) == {"standardize v1 job", "broker"}, out[-3000:]
    for what, pid in stopped.items():
        assert _gone(pid), f"{what} (pid {pid}) still runs"
    assert _group_gone(stopped["standardize v1 job"])
    assert "nothing left running" in out
    assert "Traceback" not in err
