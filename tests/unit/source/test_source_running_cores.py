"""The CPU a pipeline's running jobs use on this host, sampled from their processes: what a new backfill's
estimate counts as busy (`orchestrator.observe.estimate.running_cores`)."""

from __future__ import annotations


def test_the_cpu_of_running_jobs_is_sampled_from_their_processes():
    import subprocess
    import sys
    from types import SimpleNamespace

    from orchestrator.observe.estimate import running_cores

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        recs = [SimpleNamespace(pid=spin.pid, state="serving", version=1),
                SimpleNamespace(pid=spin.pid, state="stopped", version=0),        # not running: not counted
                SimpleNamespace(pid=None, state="backfilling", version=2)]      # no job here yet
        used, source = running_cores(recs, seconds=0.5)
        assert used > 0 and source == f"{used:.1f} busy with the job of v1"
    finally:
        spin.kill()
        spin.wait()
    assert running_cores([SimpleNamespace(pid=spin.pid, state="serving", version=1)], seconds=0.1) == (None, None)
