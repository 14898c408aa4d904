"""A pipeline's code checked before a deploy: its job keeps the job contract, its ruleset has rules files.

The job check sits here, above the jobs, because a team's job is checked by the job contract's own
`check_job` (`jobs.lib.contract.api`: the job imported, and with ``call`` called on a Kafka stream, in a
separate Python process, so the deploying process imports no team code); `orchestrator.core` reads
the pipelines file and the job's reference (`orchestrator.core.jobref`) without importing the jobs.
kappa's own jobs are found as files, nothing imported.
"""

from __future__ import annotations

from pathlib import Path

from jobs.lib.contract.api import check_job
from orchestrator.core.exceptions import ContractError
from orchestrator.core.jobref import KAPPA_OPTIONS, OWN_PACKAGE, parse_job_ref
from orchestrator.core.pipelines import PipelineSpec, check_ruleset_exists, jobs_directory

__all__ = ["check_job_exists", "check_pipeline_code"]


def check_job_exists(spec: PipelineSpec, *, job_path: list[str] | tuple[str, ...] = (), call: bool = False,
                     rules_file: str | Path | None = None) -> str:
    """The job's ``module:function``; ConfigError (`ContractError`) naming the pipeline, the job and
    what is wrong. kappa's own jobs: their file exists (their contract is kappa's tests'). A team's
    job: it imports, in a separate process, from `job_path`, and its function takes one argument;
    with `call`, it is also called on a Kafka stream there (a local Spark session, `rules_file`) and
    what it returns is checked (`jobs.lib.contract.api.check_job`)."""
    try:
        module, function = parse_job_ref(spec.job)
        if module.split(".")[0] == OWN_PACKAGE and (jobs_directory() / f"{module.split('.', 1)[1]}.py").is_file():
            return f"{module}:{function}"
        if "." not in module and ":" not in spec.job and not job_path:
            known = sorted(p.stem for p in jobs_directory().glob("*.py") if not p.stem.startswith("_")
                           and p.stem != "run")
            raise ContractError(f"job {spec.job!r} is none of kappa's jobs ({', '.join(known)}) and no job_path is "
                                f"set to import it from; set job_path (--job-path, KAPPA_JOB_PATH) to the folder "
                                f"that holds {spec.job}.py")
        request = None
        if call:
            request = {"key": list(spec.key_columns), "topics": list(spec.topics), "pipeline": spec.name,
                       "rules_file": str(rules_file) if rules_file else None,
                       "options": {k: v for k, v in spec.options.items() if k not in KAPPA_OPTIONS}}
        return check_job(spec.job, job_path, call=request)
    except ContractError as e:
        raise ContractError(f"pipeline {spec.name!r}, field 'job': {e}") from None


def check_pipeline_code(spec: PipelineSpec, *, job_path: list[str] | tuple[str, ...] = (),
                        rules_dir: Path | None = None) -> None:
    """Everything a deploy needs from the repo: the job and, if any, the ruleset."""
    check_job_exists(spec, job_path=job_path)
    check_ruleset_exists(spec, rules_dir=rules_dir)
