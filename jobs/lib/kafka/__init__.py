"""Kafka offsets around Spark's Kafka source, for the job runtime and the orchestrator.

Every job reads Kafka with Spark's own connector (``format("kafka")``, `jobs.lib.runtime.stream`).
What kappa adds around it lives here, and runs anywhere (no Spark needed):

* `planning`: offset JSON and ``{(topic, partition): offset}`` maps;
* `checkpoint`: a query's offsets read back from its Spark checkpoint;
* `progress`: what a one-batch backfill's tasks have read before it commits (written by
  `jobs.lib.runtime.backfill`, read by the orchestrator's lag);
* `groups`: finished batches' offsets committed to the version's consumer group, for Kafka's tools.
"""

from jobs.lib.kafka.checkpoint import checkpoint_offsets, last_committed_batch
from jobs.lib.kafka.groups import commit_group_offsets
from jobs.lib.kafka.planning import TP, map_to_offsets, merge_offsets, offsets_to_map

__all__ = ["TP", "offsets_to_map", "map_to_offsets", "merge_offsets", "checkpoint_offsets", "last_committed_batch",
           "commit_group_offsets"]
