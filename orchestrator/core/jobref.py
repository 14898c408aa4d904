"""A pipeline's job reference read without importing the job, and the option names kappa keeps for itself.

A pipeline's ``job`` names a function of the job contract (`jobs.lib.contract.api`): ``module:function``,
a module (its ``transform``), or a bare name of one of kappa's own jobs (``standardize``, a module in
the `jobs` package). The control plane reads it here (the pipelines file's checks, the job's command
line) and the job side reads it here too (`jobs.lib.contract.api.load_job`), so both agree on what a
reference means. Pure data and parsing: nothing here imports the jobs; kappa's own jobs are found as
files (`importlib.util.find_spec`), never imported.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from orchestrator.core.exceptions import ContractError

__all__ = ["OWN_PACKAGE", "DEFAULT_FUNCTION", "KAPPA_OPTIONS", "parse_job_ref", "resolve_job"]

#: kappa's own jobs: a bare name in the pipelines file is the module of that name in `jobs`.
OWN_PACKAGE = "jobs"
DEFAULT_FUNCTION = "transform"
#: The keys of a pipeline's ``options`` that kappa's runner takes for itself (`jobs.lib.contract.runner`);
#: the job's function gets the others.
KAPPA_OPTIONS = ("key_order", "backfill", "source_options", "upkeep", "state_partitions")

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_job_ref(ref: str) -> tuple[str, str]:
    """(module, function) of a pipeline's ``job``: ``module:function``, a module (its `transform`),
    or a bare name of one of kappa's own jobs (``standardize``: ``jobs.standardize:transform``).
    ContractError naming what is malformed."""
    module, _, function = ref.partition(":")
    function = function or DEFAULT_FUNCTION
    if not _MODULE.match(module) or not _FUNCTION.match(function):
        raise ContractError(f"job {ref!r} is not a Python module or module:function (for example "
                            f"team_jobs.profiles:transform)")
    if "." not in module and _own_job(module):
        module = f"{OWN_PACKAGE}.{module}"
    return module, function


def _own_job(name: str) -> bool:
    spec = importlib.util.find_spec(OWN_PACKAGE)
    return bool(spec and spec.submodule_search_locations and any(
        (Path(p) / f"{name}.py").is_file() for p in spec.submodule_search_locations))


def resolve_job(ref: str) -> str:
    """The ``module:function`` a pipeline's ``job`` names."""
    module, function = parse_job_ref(ref)
    return f"{module}:{function}"
