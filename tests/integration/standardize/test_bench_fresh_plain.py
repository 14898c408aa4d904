"""The plain live pipeline `kappa bench freshness` measures kappa against (`orchestrator.dev.plainlive`):
in its own process it appends the log so far, then MERGEs each live batch on the key (updates, inserts,
tombstones delete), the bench's reader sees the probes in its table, and a stop ends its process group."""

from __future__ import annotations

import json
import threading
import time

import psutil
import pytest

from orchestrator.dev import datagen
from orchestrator.dev.freshbench import Probes, follow_probes, poll_table
from orchestrator.dev.plainlive import PlainLive
from orchestrator.dev.plainspark import PLAIN_GROUP

pytestmark = pytest.mark.integration


def _doc(name: str, location: str) -> bytes:
    return json.dumps({"name": name, "title": "Engineer", "company": "Acme", "location": location,
                       "updated_at": "2026-11-29T00:00:00Z"}).encode()


def test_the_plain_live_pipeline_merges_live_batches_and_stops_on_request(bootstrap, tmp_path, unique):
    from confluent_kafka import Producer
    from jobs.lib.runtime.sparkwork import event_log_jobs
    from orchestrator.core.tables import read_table

    topic = f"plain_live_{unique}"
    datagen.ensure_topic(bootstrap, topic, 2)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(6):
        producer.produce(topic, key=b"m%d" % i, value=_doc(f"n{i}", "before"), partition=i % 2)
    producer.flush(30)

    plain = PlainLive(tmp_path / "plain", bootstrap, topic, 0.5).start()
    try:
        plain.wait_table(180)
        probes, state, done = Probes(), {}, threading.Event()
        started = time.time()

        def live() -> None:      # an update, an insert, a tombstone: each its own micro-batch's MERGE
            for key, value in ((b"m1", _doc("n1", "probe-1")), (b"m9", _doc("n9", "probe-9"))):
                probes.sent(key.decode(), value and json.loads(value)["location"], time.monotonic())
                producer.produce(topic, key=key, value=value, partition=int(key[1:]) % 2)
                producer.flush(30)
            producer.produce(topic, key=b"m2", value=None, partition=0)
            producer.flush(30)
            done.set()
        writer = threading.Thread(target=live)
        writer.start()
        follow_probes(lambda: poll_table(str(plain.output), probes, state), writer, probes, 0.1, 120,
                      console=type("Quiet", (), {"print": staticmethod(lambda *a, **k: None)}))
        assert done.is_set() and sorted(probes.latencies) and not probes.pending, probes.pending

        def rows() -> dict:
            t = read_table(str(plain.output), ["member_id", "location"])
            return dict(zip(t.column("member_id").to_pylist(), t.column("location").to_pylist()))
        deadline = time.monotonic() + 120
        while "m2" in rows() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rows() == {"m0": "before", "m1": "probe-1", "m3": "before", "m4": "before", "m5": "before",
                          "m9": "probe-9"}
    finally:
        plain.stop()
    assert plain.proc.returncode == 0, plain.log.read_text()[-3000:]
    assert not psutil.pid_exists(plain.pid) or psutil.Process(plain.pid).status() == psutil.STATUS_ZOMBIE
    groups = event_log_jobs(plain.events, since=started)      # the live batches, counted as the bench counts them
    assert groups and all(g.startswith(PLAIN_GROUP) and n >= 1 for g, n in groups.items()), groups
