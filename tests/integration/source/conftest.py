"""Fixtures for the source and runtime tests (helpers live in source_helpers.py)."""

from __future__ import annotations

import pytest

from tests.integration.source.source_helpers import Kafka


@pytest.fixture
def kafka(bootstrap) -> Kafka:
    return Kafka(bootstrap)
