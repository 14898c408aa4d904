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


def test_the_figure_and_its_words_agree_when_the_sample_lands_on_a_rounding_edge(monkeypatch):
    # CI once sampled 0.9549 cores: the estimate subtracted 0.95 while its words said "1.0 busy".
    from types import SimpleNamespace

    import psutil

    import orchestrator.observe.estimate as estimate_mod

    cpu = iter([10.0, 10.9549])

    class Proc:
        def __init__(self, pid):
            self.pid = pid

        def children(self, recursive=True):
            return []

        def cpu_times(self):
            return SimpleNamespace(user=next(cpu), system=0.0)

    clock = iter([100.0, 101.0])
    monkeypatch.setattr(psutil, "Process", Proc)
    monkeypatch.setattr(estimate_mod.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(estimate_mod.time, "sleep", lambda s: None)
    used, source = estimate_mod.running_cores([SimpleNamespace(pid=4242, state="serving", version=1)], seconds=1)
    assert (used, source) == (1.0, "1.0 busy with the job of v1")
