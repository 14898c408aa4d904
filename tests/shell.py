"""The environment of a user's shell, for the `kappa` processes the integration tests start as a user would."""

from __future__ import annotations

import os

from orchestrator.core.envvars import KAPPA_SPARK_JIT


def users_env(*prefixes: str) -> dict[str, str]:
    """This process's environment without the suite's settings: every variable whose name starts with
    ``KAPPA_`` or one of `prefixes`, as a user's shell has none of them. One is kept: the JIT of the jobs'
    JVMs (`KAPPA_SPARK_JIT`, C1 only in the suite, tests/conftest.py), which changes the CPU a job spends,
    never what it does; without it the jobs of `kappa up`'s walk, the demo and a team's project compiled
    with C2 beside the rest of the suite on two cores."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAPPA_", *prefixes))}
    if KAPPA_SPARK_JIT in os.environ:
        env[KAPPA_SPARK_JIT] = os.environ[KAPPA_SPARK_JIT]
    return env
