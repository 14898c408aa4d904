"""The changelog generator (the expected table is the tests' own: test_standardize_oracle.py)."""

from __future__ import annotations

import json
import re
import types
from collections import Counter

import confluent_kafka
import pytest

from orchestrator.core.exceptions import BrokerError
from orchestrator.dev import datagen
from orchestrator.dev.datagen import MALFORMED_KINDS, generate_changelog, member_key
from tests.oracle.standardize import key_reason, standardize, value_reason


def test_generator_is_deterministic_and_has_every_kind_of_record():
    a = list(generate_changelog(20_000, 2_000, seed=4, malformed_share=0.05, delete_share=0.05))
    b = list(generate_changelog(20_000, 2_000, seed=4, malformed_share=0.05, delete_share=0.05))
    c = list(generate_changelog(20_000, 2_000, seed=5, malformed_share=0.05, delete_share=0.05))
    assert a == b and a != c
    kinds = Counter(r.kind for r in a)
    assert set(kinds) == {"upsert", "tombstone", *MALFORMED_KINDS}
    assert 0.03 < kinds["tombstone"] / 18_000 < 0.07
    assert 0.03 < sum(kinds[k] for k in MALFORMED_KINDS) / 18_000 < 0.07
    assert [r.key for r in a[:2000]] == [member_key(i) for i in range(2000)]  # every member created first
    assert all(r.kind == "upsert" for r in a[:2000])
    upserts = [json.loads(r.value) for r in a if r.kind == "upsert"]
    assert any(not r["name"].isascii() for r in upserts) and any(
        r["title"] and not r["title"].isascii() for r in upserts)
    assert all(key_reason(r.key) is None and value_reason(r.value) is None for r in a if r.kind == "upsert")
    assert all(r.key is not None for r in a)      # a compacted topic refuses a record without a key
    assert all(r.value is None for r in a if r.kind == "tombstone")


def test_value_size_pads_to_about_the_target():
    sizes = [len(r.value) for r in generate_changelog(2000, 500, seed=1, value_size=200,
                                                       malformed_share=0, delete_share=0)]
    assert 195 <= sum(sizes) / len(sizes) <= 215


def test_v2_changes_a_visible_share_of_titles():
    recs = [r for r in generate_changelog(20_000, 20_000, seed=2) if r.kind == "upsert"]
    titles = [json.loads(r.value)["title"] for r in recs]
    changed = sum(standardize("titles", t, "v1") != standardize("titles", t, "v2") for t in titles)
    assert 0.15 < changed / len(titles) < 0.6


def test_reading_the_log_gives_up_when_its_position_stops_passing_its_furthest_point(monkeypatch):
    """A fetch reset to the log start returns records again and again without the position ever reaching the
    high watermark: the reader counted any returned record as progress and looped until pytest-timeout ended
    the disk-full fault test 900 s later. Progress is now the position passing its furthest point."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(datagen, "time", types.SimpleNamespace(monotonic=lambda: clock.now, time_ns=lambda: 1))
    monkeypatch.setattr(datagen, "topic_partitions", lambda *a, **kw: 1)

    class Message:
        def __init__(self, offset):
            self._offset = offset

        def error(self):
            return None

        def key(self):
            return b"k"

        def value(self):
            return b"{}"

        def partition(self):
            return 0

        def offset(self):
            return self._offset

        def timestamp(self):
            return (1, 0)

    class Resetting:
        """Offsets 0-4 of a log whose high watermark is 10, then from 0 again, each call one second later."""
        calls = 0

        def __init__(self, conf):
            self.next = 0

        def get_watermark_offsets(self, tp, timeout=None):
            return 0, 10

        def assign(self, tps):
            pass

        def consume(self, n, timeout):
            Resetting.calls += 1
            assert Resetting.calls < 1000, "the reader never gave up"
            clock.now += 1.0
            start, self.next = self.next, (self.next + 1) % 5
            return [Message(start)]

        def position(self, tps):
            return [types.SimpleNamespace(offset=self.next)]

        def close(self):
            pass

    monkeypatch.setattr(confluent_kafka, "Consumer", Resetting)
    with pytest.raises(BrokerError) as err:
        list(datagen.iter_log("127.0.0.1:9", "t", timeout=30))
    assert re.fullmatch(r"reading t\[0\] made no progress for 30s at offset [0-5] of 10", str(err.value)), err.value
    assert Resetting.calls < 40
