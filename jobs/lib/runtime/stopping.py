"""A requested stop, inside the job's process: once asked, no new micro-batch does any work.

Spark has no "stop after this batch": `StreamingQuery.stop()` interrupts a batch in flight, and a query
left running starts its next batch as soon as the one before commits. So kappa's runtime (`loop`)
waits for the batch in flight, and the stop gate, wrapped around every foreachBatch function
(`jobs.lib.runtime.stream`), refuses any batch that starts after the request: it raises
`StopBeforeBatch` before the job's function is called. Nothing of that batch is written or
committed; Spark has planned it (`offsets/N` in the checkpoint), so the next start of the version
runs it first, with the same offsets. The query then ends "with an error" in Spark's terms (Spark
logs `FOREACH_BATCH_USER_FUNCTION_ERROR ... StopBeforeBatch`); the runtime knows that error as the
requested stop and reports the job `stopped`.

Never the other way: a foreachBatch function that returned early without writing would let Spark
mark the batch committed, and its records would be lost to the version.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

__all__ = ["GATE", "StopBeforeBatch", "StopGate"]


class StopBeforeBatch(Exception):
    """Raised by the stop gate in place of a micro-batch that started after a stop was requested."""


class _NotAnError(logging.Filter):
    """py4j logs every exception a Python callback raises at ERROR, with its traceback: not this one."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StopBeforeBatch))


logging.getLogger("py4j.clientserver").addFilter(_NotAnError())


class StopGate:
    """Process-wide: `request()` once a stop is asked; `wrap(sink)` is what Spark's foreachBatch calls."""

    def __init__(self) -> None:
        self._requested = threading.Event()
        self._lock = threading.Lock()
        self.in_flight: int | None = None      # the batch whose function runs now
        self.last_done: int | None = None      # the last batch whose function returned
        self.refused: int | None = None        # the batch refused after the request

    def reset(self) -> None:
        """A new run of the job (or a test) starts with no stop requested."""
        with self._lock:
            self._requested.clear()
            self.in_flight = self.last_done = self.refused = None

    def request(self) -> None:
        self._requested.set()

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    def wrap(self, sink: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        """`sink` behind the gate: a batch that starts after `request()` raises `StopBeforeBatch`."""
        def gated(batch: Any, batch_id: int) -> None:
            with self._lock:
                if self._requested.is_set():
                    self.refused = int(batch_id)
                    raise StopBeforeBatch(
                        f"kappa: stop requested: micro-batch {batch_id} not started; it runs from the checkpoint "
                        f"at the next start of the version (this ends the query as asked, it is not a failure)")
                self.in_flight = int(batch_id)
            try:
                sink(batch, batch_id)
            finally:
                with self._lock:
                    self.in_flight, self.last_done = None, int(batch_id)
        return gated


#: The job process's gate (one job per process).
GATE = StopGate()
