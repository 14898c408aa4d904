"""`built_once`: a job's expressions made once per Spark context, never across two."""

from __future__ import annotations

from pyspark import SparkContext

from jobs.lib.runtime.columns import built_once


def test_expressions_are_made_once_per_context_and_again_under_a_new_one(monkeypatch):
    made = []

    def build():
        made.append(object())
        return made[-1]

    first, second = object(), object()
    monkeypatch.setattr(SparkContext, "_active_spark_context", first)
    a = built_once(("test", 1), build)
    assert built_once(("test", 1), build) is a and len(made) == 1
    assert built_once(("test", 2), build) is not a and len(made) == 2        # another key: its own
    monkeypatch.setattr(SparkContext, "_active_spark_context", second)     # a new context (its own UDF accumulator)
    assert built_once(("test", 1), build) is not a and len(made) == 3
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)       # none running: made, not kept
    built_once(("test", 1), build)
    built_once(("test", 1), build)
    assert len(made) == 5
