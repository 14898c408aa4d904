"""Spark expressions made once per Spark context, not once per micro-batch.

A job's function runs on every micro-batch (`jobs.lib.contract.runner`), and every ``F.*`` call,
``lit``, ``when`` or UDF it makes is a round trip to the JVM. The standardize job's plan took about
4,500 of them per batch (the rules' lookup map, one ``lit`` per spelling, and the JSON parse's
checks), 0.6-1 s of a live batch's driver time on 2 cores, for expressions that are the same every
batch. A `Column` is an expression by column names, bound to no DataFrame, so one made for the first
batch serves them all: `built_once(key, build)` returns what `build()` made the first time it was
asked for `key` under the running Spark context. The cache is dropped when the context changes (a
Python UDF in an expression holds its context's accumulator), and it never leaves the driver.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable, TypeVar

__all__ = ["built_once"]

T = TypeVar("T")

_lock = threading.Lock()
_built: dict[Hashable, Any] = {}
_context: list[Any] = [None]   # the SparkContext `_built` belongs to


def built_once(key: Hashable, build: Callable[[], T]) -> T:
    """What `build()` returns, made once per Spark context for `key` (see the module). `key` must name
    everything the expressions depend on."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        return build()
    with _lock:
        if _context[0] is not sc:
            _built.clear()
            _context[0] = sc
        if key in _built:
            return _built[key]
    made = build()   # outside the lock: a build may call built_once itself
    with _lock:
        if _context[0] is sc:
            made = _built.setdefault(key, made)
    return made
