"""A reprocess reads a log the cleaner has compacted, on the embedded Apache Kafka, and is exact.

The topic has the demo's fast-compaction settings, with the cleaner held back at first
(`min.compaction.lag.ms` of an hour). Three waves of updates, a second apart, so the first two
land in segments that close; the second wave ends a few keys with a malformed record. v1 reads
the whole log and is promoted. Then the cleaner is let go (`min.compaction.lag.ms=0`): the
closed segments lose every record a later one of the same key supersedes, while log start and
end offsets stay as they were and the log has offset gaps. v2, deployed after that, reads the
compacted log from offset zero across the gaps, and its table and rejects equal the oracle's
for the log as it is now (tests/oracle), tombstones included.

The keys whose latest record is malformed have lost their earlier valid value with compaction:
v1 serves them, v2 cannot derive them. The validation report counts exactly those keys as lost
to compaction, apart from the keys only in v1 and outside the key-count check.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from control_live import DEADLINE, PARTITIONS, PIPELINE, make_spec
from orchestrator.context import Kappa
from orchestrator.core.settings import Settings
from orchestrator.dev import datagen
from orchestrator.dev.broker import FAST_COMPACTION
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote
from orchestrator.lifecycle.report import validation_report
from orchestrator.observe.lag import log_offsets
from orchestrator.registry import Registry
from tests.oracle.standardize import expected_table
from tests.served import version_diff
from tests.teardown import kill_jobs

pytestmark = pytest.mark.integration

KEYS = 300
#: Keys per partition whose last record (in the second wave, in a segment that closes) is malformed:
#: once each has lost its earlier value, the cleaner has been through every partition.
LOST_PER_PARTITION = 2


def _allow_cleaning(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("min.compaction.lag.ms", "0", incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(30)


def test_a_reprocess_of_a_compacted_log_is_exact_and_counts_the_keys_compaction_took(bootstrap, tmp_path, seed):
    unique = uuid.uuid4().hex[:8]
    topic, alias = f"compacted_{unique}", f"compacted_std_{unique}"
    datagen.ensure_topic(bootstrap, topic, PARTITIONS, fast_compaction=True,
                         topic_config={"min.compaction.lag.ms": str(3600 * 1000)})
    assert FAST_COMPACTION["segment.ms"] == "1000"
    # waves a segment apart: the first two end up in closed segments, the third stays active
    datagen.produce(bootstrap, topic, datagen.generate_changelog(4000, KEYS, seed=seed, delete_share=0.05,
                                                                 malformed_share=0.01), partitions=PARTITIONS)
    time.sleep(1.5)
    second = list(datagen.generate_changelog(3000, KEYS, seed=seed + 1, delete_share=0.05, malformed_share=0.01,
                                             first_new=False))
    lost_keys = [key for p in range(PARTITIONS) for key in [datagen.member_key(i) for i in range(KEYS)
                 if datagen.partition_for(datagen.member_key(i), PARTITIONS) == p][:LOST_PER_PARTITION]]
    second += [datagen.ChangeRecord(key, b'{"name": "Broken', "invalid_json") for key in lost_keys]
    datagen.produce(bootstrap, topic, second, partitions=PARTITIONS)
    time.sleep(1.5)
    third = [r for r in datagen.generate_changelog(400, KEYS, seed=seed + 2, delete_share=0.05, malformed_share=0.0,
                                                   first_new=False) if r.key not in set(lost_keys)]
    datagen.produce(bootstrap, topic, third, partitions=PARTITIONS)
    # one more record per partition a segment later: the third wave's segment closes too
    time.sleep(1.5)
    datagen.produce(bootstrap, topic, [datagen.ChangeRecord(datagen.member_key(KEYS + p), None, "tombstone")
                                       for p in range(4 * PARTITIONS)], partitions=PARTITIONS)

    home = tmp_path / "home"
    reg = Registry(f"sqlite:///{home / 'registry.db'}")
    k = Kappa(Settings(home=home, bootstrap_servers=bootstrap), registry=reg,
              pipelines={PIPELINE: make_spec(topic, alias, key_count_tolerance=0.0)})
    try:
        v1 = deploy(k, k.pipeline(PIPELINE), "v1", actor="tests", reason="reads the whole log").version
        assert wait_ready(k.version(PIPELINE, v1), deadline_seconds=DEADLINE, poll_seconds=1).ready
        promote(k.version(PIPELINE, v1), actor="tests", reason="v1 serves")
        whole = list(datagen.iter_log(bootstrap, topic))
        offsets_before = log_offsets(k, [topic])
        everything = expected_table(whole, "v1")
        paths1 = k.paths(PIPELINE, v1)
        why, _ = version_diff(paths1.table, paths1.rejects, bootstrap, topic, "v1")
        assert why is None, f"v1 before compaction: {why}"

        _allow_cleaning(bootstrap, topic)
        # the keys whose valid value the cleaner is to take: a broken record is their latest, and they had a
        # value before it (a key the generator deleted before its broken record has none to lose)
        keys_all = set(everything.table.column("member_id").to_pylist())
        forced = {key.decode() for key in lost_keys} & keys_all
        assert len(forced) >= len(lost_keys) // 2, f"too few forced keys with a value: {sorted(forced)}"
        deadline = time.monotonic() + 180
        while True:   # until the cleaner has been through every partition: each forced key lost its value
            now = list(datagen.iter_log(bootstrap, topic))
            left = forced & set(expected_table(now, "v1").table.column("member_id").to_pylist())
            if not left:
                break
            assert time.monotonic() < deadline, f"the cleaner left the earlier values of {sorted(left)} for 180 s"
            time.sleep(2)
        assert log_offsets(k, [topic]) == offsets_before, "compaction moved a log start or end offset"
        assert len(now) < len(whole)
        gaps = 0
        for p in range(PARTITIONS):
            offs = sorted(r.offset for r in now if r.partition == p)
            gaps += sum(1 for a, b in zip(offs, offs[1:]) if b > a + 1)
        assert gaps > 0, "a compacted log has offset gaps"
        print(f"{topic}: {len(whole)} records before the cleaner, {len(now)} after; {gaps} offset gaps")

        v2 = deploy(k, k.pipeline(PIPELINE), "v1", actor="tests", reason="reprocess the compacted log").version
        assert wait_ready(k.version(PIPELINE, v2), deadline_seconds=DEADLINE, poll_seconds=1).ready
        paths2 = k.paths(PIPELINE, v2)
        why, rows = version_diff(paths2.table, paths2.rejects, bootstrap, topic, "v1")
        assert why is None, f"v2 over the compacted log: {why}"

        expected_now = expected_table(now, "v1")
        keys_now = set(expected_now.table.column("member_id").to_pylist())
        gone = keys_all - keys_now
        assert forced <= gone

        report = validation_report(k.version(PIPELINE, v2))
        print(json.dumps(report.model_dump(mode="json"), indent=1, default=str)[:3000])
        assert report.keys_lost_to_compaction == len(gone)
        assert report.keys_only_serving == 0 and report.keys_only_new == 0
        assert report.key_count_ok is True and report.rows_changed == 0
        assert report.keys_serving == report.keys_new + len(gone)
    finally:
        kill_jobs(k, [PIPELINE])
        reg.close()
