"""The job contract: what a pipeline's job gets from kappa and gives back, and kappa's side of it.

* `api`: `JobInput`, `Upserts`, `Stateful` and the checks of a job (what a team's job imports);
* `runner`: kappa's runner, through which every pipeline's job runs (``python -m jobs.run``);
* `testing`: helpers for a team's tests of its own jobs, without Kafka.
"""
