"""The context a verb runs in: the process's `Kappa` and the `VersionRef` it acts on.

A verb's entry (a CLI command, an Airflow task, a supervision pass) builds a `Kappa` once per process
and resolves the version it acts on once (`Kappa.version`): the pipeline's spec, the version's paths,
its registry record as read then, and the settings, in one `VersionRef` that every layer below takes
instead of `(k, pipeline, version)`. Layer: above `core` and `registry`, below everything that acts.
"""

from orchestrator.context.kappa import KAFKA_LOGGER, Kappa, VersionRef

__all__ = ["KAFKA_LOGGER", "Kappa", "VersionRef"]
