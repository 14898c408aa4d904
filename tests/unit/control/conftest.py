"""Fixtures of the control-plane unit tests: a real SQLite registry in tmp_path, a declared
pipeline, a fake log (the broker's offsets, the group's and the checkpoint's, no broker), and
fake job processes that follow the runtime's status/STOP contract without Spark."""

from control_helpers import fake_jobs, fake_log, k, spec  # noqa: F401  (fixtures)
