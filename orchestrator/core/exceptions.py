"""One root exception for kappa, one subclass per area.

Messages name the thing, what was expected, and the setting or command that fixes it.
Only the CLI turns these into a one-line error and a non-zero exit.
"""


class KappaError(Exception):
    """Root of every error kappa raises on purpose."""


class ConfigError(KappaError):
    """A configuration file, setting or name is invalid."""


class RulesError(ConfigError):
    """A rules file cannot be loaded or does not validate."""


class ContractError(ConfigError):
    """A pipeline's job does not import or does not keep the job contract (`jobs.lib.contract.api`)."""


class BrokerError(KappaError):
    """The Kafka-protocol broker cannot be started, reached or used as asked."""


class BrokerUnreachable(BrokerError):
    """A call to the broker failed or timed out (down, or the network to it cut): not a refusal of
    kappa's credentials, not a missing topic. A lag it leaves unknown says nothing about the version."""


class SourceError(KappaError):
    """The Kafka source cannot read what it was asked to read."""


class SinkError(KappaError):
    """A Delta table cannot be written as asked."""


class RegistryError(KappaError):
    """The registry database refused or lost an operation."""


class NotFoundError(RegistryError):
    """An unknown pipeline, version or alias."""


class ConflictError(RegistryError):
    """A concurrent operation won: the state changed since it was read."""


class LifecycleError(KappaError):
    """A job cannot be started, stopped or inspected."""


class NotReadyError(KappaError):
    """A version does not meet the preconditions of the operation (promote, flip).

    `failed_checks` names the preconditions that failed when the refusal comes from a list of
    checks (a promote's "ready", "key_count", "reject_rate", "report"); empty otherwise.
    """

    def __init__(self, message: str, failed_checks: tuple[str, ...] | list[str] = ()) -> None:
        super().__init__(message)
        self.failed_checks = tuple(failed_checks)


class AirflowError(KappaError):
    """The Airflow REST API refused a request or could not be reached."""


class Refusal(KappaError):
    """A refusal rather than a failure: the request is understood and kappa works, but the present
    state forbids it (a protected version, a job that serves without --force, a source topic that is
    not compacted, a confirmation not given); nothing was changed. Raised mixed into an area's class
    (`RefusedError`, `SourceRefusedError`), so `except LifecycleError` still catches it."""


class RefusedError(LifecycleError, Refusal):
    """A lifecycle verb refused to act in the present state (retire a protected version, stop a serving
    job without --force, retire without confirmation)."""


class SourceRefusedError(SourceError, Refusal):
    """A source cannot be reprocessed as asked without --force (a topic that is not compacted)."""


#: The errors that are refusals (the CLI exits 3 for them, 1 for any other KappaError): a version not
#: ready (NotReadyError), a concurrent change or a second reprocess in flight (ConflictError), and
#: every `Refusal`.
REFUSALS: tuple[type[KappaError], ...] = (Refusal, NotReadyError, ConflictError)


def is_refusal(e: BaseException) -> bool:
    """Whether `e` is a refusal (see REFUSALS) rather than an error."""
    return isinstance(e, REFUSALS)
