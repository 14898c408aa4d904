"""A consumer group's committed offsets, read right after a broker starts, do not crash kappa.

Apache Kafka answers OffsetFetch with NOT_COORDINATOR while it creates and loads its offsets topic
after a start. librdkafka's `AdminClient.list_consumer_group_offsets` then dereferences a null
consumer group and the whole process dies with SIGSEGV (confluentinc/librdkafka#5040): that is how
`kappa` died in its first lag reading on a new broker. `group_offsets` asks through a consumer of
the group instead, which retries that answer. The reading runs in a child process, on a broker
started for it, so a crash fails this test instead of the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]

CHILD = textwrap.dedent("""
    import json, sys
    from confluent_kafka import Consumer, TopicPartition
    from orchestrator.context import Kappa
    from orchestrator.core.settings import Settings
    from orchestrator.dev import datagen
    from orchestrator.dev.broker import EmbeddedBroker
    from orchestrator.observe.lag import group_offsets

    work = sys.argv[1]
    with EmbeddedBroker(work + "/broker") as b:
        datagen.ensure_topic(b.bootstrap_servers, "t", 2)
        k = Kappa(Settings(home=work + "/home", bootstrap_servers=b.bootstrap_servers))
        unknown = group_offsets(k, "never-committed", ["t"])          # the first group call on this broker
        c = Consumer({"bootstrap.servers": b.bootstrap_servers, "group.id": "g"})
        c.commit(offsets=[TopicPartition("t", 0, 7), TopicPartition("t", 1, 3)], asynchronous=False)
        c.close()
        known = group_offsets(k, "g", ["t"])
        print(json.dumps({"unknown": sorted(unknown.items()), "known": sorted(known.items())}))
""")


def test_group_offsets_right_after_a_broker_start(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, f"exit {proc.returncode} (-11: SIGSEGV)\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"unknown": [], "known": [[["t", 0], 7], [["t", 1], 3]]}
