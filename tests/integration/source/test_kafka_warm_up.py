"""`KafkaWarmUp`: the query's first offsets request, made beforehand by an admin client of the source's
settings (`jobs.lib.runtime.stream`). Its reading is tested through `start_job` in the standardize
tests; here, what it does when the broker does not answer."""

from __future__ import annotations

import socket

import pytest

from jobs.lib.runtime.stream import KafkaWarmUp, kafka_options

pytestmark = pytest.mark.integration


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_broker_that_does_not_answer_leaves_one_line_without_secrets_and_raises_nothing(spark):
    password = "warm-up-secret-4711"
    options = kafka_options(f"127.0.0.1:{_closed_port()}", "profiles",
                            kafka_config={"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                          "sasl.username": "kappa", "sasl.password": password})
    assert any(password in v for v in options.values())   # the admin client is given it, in its JAAS config
    warm = KafkaWarmUp(spark, options, timeout=2)
    warm.start()
    warm.join(120)
    assert not warm.is_alive()
    assert warm.offsets is None
    assert warm.error and "\n" not in warm.error and password not in warm.error, warm.error
    assert "TimeoutException" in warm.error, warm.error
