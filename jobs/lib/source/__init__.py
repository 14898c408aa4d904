"""Reading Kafka and parsing its records: offsets, checkpoints, read progress, consumer groups, JSON values.

Every job reads Kafka with Spark's own connector (``format("kafka")``, its options from
`jobs.lib.runtime.stream`). What kappa adds around it runs anywhere (no Spark needed):

* `offsets`: offset JSON and ``{(topic, partition): offset}`` maps;
* `checkpoint`: a query's offsets read back from its Spark checkpoint;
* `read_progress`: what a one-batch backfill's tasks have read before it commits (written by
  `jobs.lib.runtime.backfill`, read by the orchestrator's lag);
* `consumer_groups`: finished batches' offsets committed to the version's consumer group, for Kafka's tools.

And the parsing of the records a job reads, in the JVM wherever it can vouch for the answer:

* `json_values`: a record's JSON value parsed once in the JVM, exactly as a Python parser would;
* `events`: the seed topics' JSON event schemas and their exact parser; `event_columns`: the same in the JVM;
* `profiles`: the standardize job's member-profile records.
"""
