"""Broker unavailability: which Kafka errors mean "the broker is not there right now", and waiting.

A broker restart, a rolling upgrade, a leader election or a network blip shows up in a client as
connection refused (``_TRANSPORT``, ``_ALL_BROKERS_DOWN``), requests timing out (``_TIMED_OUT``,
``REQUEST_TIMED_OUT``: a paused or overloaded broker) or no leader for a partition (``_NOENT``, "No
leaders found", while a single broker restarts). None of them
says anything about the query: the same request succeeds once the broker is back. So the driver's
metadata and offset requests (`jobs.lib.kafka.broker`) and the executors' range reads
(`jobs.lib.kafka.reading`) wait them out with backoff for ``brokerOutageSeconds`` (default 120)
and only then fail, with a `SourceError` whose message starts with `UNAVAILABLE`, so that a
supervisor can tell "restart me when the broker is back" from bad input.

Bad input is never waited for: an unknown topic once the broker answered, failed authentication
or authorization, an invalid client setting. Those fail at once with their one-line error.
"""

from __future__ import annotations

import logging
import time

from orchestrator.core.exceptions import SourceError

__all__ = ["UNAVAILABLE", "Outage", "is_unavailable", "is_bad_input", "kafka_error_of"]

log = logging.getLogger("kappa.source")

#: Every SourceError of a broker that stayed unreachable for brokerOutageSeconds starts with this;
#: `orchestrator.lifecycle.supervise` restarts such a job (anything else a SourceError says is bad
#: input that a restart would only repeat).
UNAVAILABLE = "broker unavailable:"
#: Backoff between two attempts: doubling from the first, capped.
FIRST_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 5.0

_UNAVAILABLE_CODES: frozenset[int] | None = None
_BAD_INPUT_CODES: frozenset[int] | None = None


def _codes() -> tuple[frozenset[int], frozenset[int]]:
    global _UNAVAILABLE_CODES, _BAD_INPUT_CODES
    if _UNAVAILABLE_CODES is None:
        from confluent_kafka import KafkaError as E

        def of(*names: str) -> frozenset[int]:
            return frozenset(getattr(E, n) for n in names if hasattr(E, n))

        _UNAVAILABLE_CODES = of(
            "_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_MSG_TIMED_OUT", "_TIMED_OUT_QUEUE", "_RESOLVE",
            "_WAIT_COORD", "_NODE_UPDATE", "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION", "LEADER_NOT_AVAILABLE",
            "NOT_LEADER_FOR_PARTITION", "NOT_LEADER_OR_FOLLOWER", "BROKER_NOT_AVAILABLE",
            "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS", "NOT_COORDINATOR",
            "NOT_ENOUGH_REPLICAS", "KAFKA_STORAGE_ERROR", "_NOENT")
        _BAD_INPUT_CODES = of(
            "_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "TOPIC_AUTHORIZATION_FAILED",
            "CLUSTER_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED", "_SSL", "_INVALID_ARG",
            "UNSUPPORTED_SASL_MECHANISM", "ILLEGAL_SASL_STATE", "INVALID_CONFIG")
    return _UNAVAILABLE_CODES, _BAD_INPUT_CODES  # type: ignore[return-value]


def kafka_error_of(exc: BaseException | None):
    """The confluent_kafka KafkaError inside `exc` (a KafkaException, or one it was raised from)."""
    from confluent_kafka import KafkaError, KafkaException

    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
            return exc.args[0]
        if isinstance(exc, KafkaError):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def is_unavailable(exc: BaseException) -> bool:
    """True when `exc` means the broker (or a partition's leader) cannot be reached right now."""
    err = kafka_error_of(exc)
    if err is None:
        return False
    unavailable, bad = _codes()
    if err.fatal() or err.code() in bad:
        return False
    return err.code() in unavailable or bool(err.retriable())


def is_bad_input(exc: BaseException) -> bool:
    """True when `exc` is a Kafka error that retrying cannot fix (authentication, authorization, a
    bad client setting, a fatal client error)."""
    err = kafka_error_of(exc)
    if err is None:
        return False
    return bool(err.fatal()) or err.code() in _codes()[1]


class Outage:
    """One stretch of an unreachable broker: `wait(exc)` sleeps the next backoff, or raises the
    `UNAVAILABLE` SourceError once `brokerOutageSeconds` have passed since the first failure."""

    def __init__(self, settings, what: str):
        self.settings = settings
        self.what = what
        self.started = time.monotonic()
        self.attempts = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def wait(self, exc: BaseException) -> None:
        self.attempts += 1
        limit = float(self.settings.broker_outage_seconds)
        elapsed = self.elapsed()
        if elapsed >= limit:
            raise SourceError(
                f"{UNAVAILABLE} cannot {self.what} from Kafka at {self.settings.bootstrap_servers}: no answer "
                f"for {elapsed:.0f} s ({self.attempts} attempts; brokerOutageSeconds={limit:g}): {exc}. Check "
                f"that the broker runs and is reachable; the job resumes from its checkpoint when restarted"
            ) from None
        if self.attempts == 1:
            log.warning("Kafka at %s is unavailable (%s); retrying to %s for up to %g s (brokerOutageSeconds)",
                        self.settings.bootstrap_servers, exc, self.what, limit)
        backoff = min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2 ** (self.attempts - 1), limit - elapsed)
        time.sleep(max(0.0, backoff))
