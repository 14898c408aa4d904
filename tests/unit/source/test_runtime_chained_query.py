"""The backfill query, then the live one (`jobs.lib.runtime.stream.ChainedQuery`), without Spark.

Spark marks an available-now query inactive (`TERMINATED`) as soon as its last batch is done, but
unregisters it from the session only after it has closed its Kafka clients; a query of the same name
started in that window is refused ("a query with that name is already active"). The fake below holds
that window open until someone waits for the query's termination without a timeout, which is what
Spark's `awaitTermination()` returns after (its termination latch is released last)."""

from __future__ import annotations

import threading

import pytest

from jobs.lib.runtime.stream import ChainedQuery


class FakeQuery:
    def __init__(self, name: str, active: bool):
        self.name, self.active, self.registered = name, active, True
        self.id, self.runId = "query-id", f"run-{name}"
        self.waited_without_timeout = threading.Event()

    @property
    def isActive(self) -> bool:
        return self.active

    def exception(self):
        return None

    def awaitTermination(self, timeout=None):
        if timeout is None:           # Spark: returns once the run is unregistered and its latch released
            self.registered = False
            self.waited_without_timeout.set()
            return None
        return not self.active and not self.registered

    def stop(self):
        self.active = False


class SessionRefuses(Exception):
    """What Spark's StreamingQueryManager.startQuery raises for a name that is still registered."""


def chain(first: FakeQuery, started: list, fail: Exception | None = None) -> ChainedQuery:
    def then():
        if fail is not None:
            raise fail
        if first.registered:
            raise SessionRefuses(f"Cannot start query with name {first.name} as a query with that name is "
                                 f"already active in this SparkSession")
        live = FakeQuery(first.name, active=True)
        started.append(live)
        return live
    return ChainedQuery(first, then)


def test_the_live_query_starts_only_after_the_backfill_query_has_left_the_session():
    backfill, started = FakeQuery("kappa-standardize-v2", active=False), []   # its last batch committed
    q = chain(backfill, started)
    assert q.isActive                      # the live query runs
    assert backfill.waited_without_timeout.is_set() and len(started) == 1
    assert q.runId == "run-kappa-standardize-v2" and q.exception() is None
    assert q.awaitTermination(0.1) is False and len(started) == 1           # started once


def test_a_live_query_that_cannot_start_is_the_chain_s_failure_not_a_clean_stop():
    backfill = FakeQuery("kappa-standardize-v2", active=False)
    refused = SessionRefuses("the sink's table is gone")
    q = chain(backfill, [], fail=refused)
    with pytest.raises(SessionRefuses):
        q.awaitTermination(0.5)            # the job's loop breaks out of its wait on this
    assert not q.isActive                  # nothing runs
    assert q.exception() is refused        # and the loop reports it: the job fails, it does not "stop"
