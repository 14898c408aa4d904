"""Fixtures of the standardize integration tests (helpers in std_helpers.py)."""

from __future__ import annotations

import pytest
from std_helpers import Changelog, JobPaths, make_changelog


@pytest.fixture
def changelog(bootstrap, unique, seed) -> Changelog:
    """A 4-partition compacted topic with creates, updates, deletes, malformed records and unicode."""
    return make_changelog(bootstrap, unique, seed)


@pytest.fixture
def paths(tmp_path) -> JobPaths:
    return JobPaths(tmp_path)
