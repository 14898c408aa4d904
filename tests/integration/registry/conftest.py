"""Registry fixtures: a migrated Registry on each database of the shared `registry_url` param."""

from __future__ import annotations

import pytest

from orchestrator.registry import Registry


@pytest.fixture
def registry(registry_url):
    reg = Registry(registry_url)
    try:
        yield reg
    finally:
        reg.close()
