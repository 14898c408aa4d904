"""The process runtime every kappa job runs in: arguments, Spark, status file, graceful stop.

Jobs themselves are functions of the job contract (`jobs.lib.contract.api`); kappa's runner
(`jobs.lib.contract.runner`, ``python -m jobs.run``) gives the runtime its ``build(ctx)``, which starts the
job's query. The runtime's own contract, for the runner (and the tests' echo job)::

    from jobs.lib.runtime.context import JobContext
    from jobs.lib.runtime.loop import run
    from jobs.lib.runtime.stopping import GATE          # kappa's own jobs get it from `stream.start_stream`

    def build(ctx: JobContext):
        reader = ctx.spark.readStream.format("kafka")   # Spark's Kafka source
        for k, v in ctx.kafka_options().items():         # the version's options and kafka.* settings
            reader = reader.option(k, v)
        return (reader.load().writeStream.foreachBatch(GATE.wrap(...))   # call ctx.record_batch(...) in there
                .option("checkpointLocation", ctx.args.checkpoint)
                .trigger(**ctx.trigger_kwargs()).start())

    if __name__ == "__main__":
        run(build)

and runs as ``python -m jobs.run --job MODULE:FUNCTION --key COLUMNS --pipeline P --version N
--bootstrap-servers B --topics t1,t2 --output PATH --rejects PATH --checkpoint PATH --run-dir PATH
--group-id G [--rules FILE] [--job-path DIRS] [--max-records-per-batch 100000] [--trigger
available-now|continuous] [--interval-seconds 1] [--kafka-config-file PATH] [--kafka-config JSON]
[--master URL] [--extra JSON]``.
The Kafka config's secrets come only in the 0600 file of ``--kafka-config-file``, never on the
command line (see `jobs.lib.runtime.args`).

What the runtime guarantees, so the orchestrator can watch and steer any job the same way:

* ``<run-dir>/status.json`` is replaced atomically when the job starts, after every micro-batch
  and on a 2 s heartbeat: ``pipeline, version, pid, state, started_at, heartbeat_at, batch_id,
  batches, rows_in, rows_out, rejects, rejects_total, end_offsets, error, rules_hash`` (plus
  ``query_id``, ``trigger``). ``state`` (`RunState`) goes ``starting -> running`` and ends in
  ``finished`` (available-now reached its end offsets; exit 0), ``stopped`` (``<run-dir>/STOP``
  appeared or SIGTERM/SIGINT; ``stopping`` while the current micro-batch completes; exit 0) or
  ``failed`` (``error`` set; exit 1). ``rows_in/rows_out/rejects`` are totals since this process
  started; ``rejects_total`` is the output's cumulative reject count when the job reports it.
* Batch completion is tracked by a StreamingQueryListener (batch id, input rows, end offsets of
  each completed micro-batch); a job refines the counts from its foreachBatch function with
  ``ctx.record_batch(batch_id, rows_in, rows_out, rejects, rejects_total=None)``, and sets
  ``ctx.rules_hash`` when it applies rules.
* A requested stop ends the query after the micro-batch in flight; no new micro-batch does any work
  once it is asked (the stop gate around foreachBatch, `stopping`: a batch that starts after the
  request is refused before the job's function runs, and runs from the checkpoint at the next start).
  Its bound is kappa's (the pipeline's ``stop_timeout_seconds``): a SIGTERM after the request stops
  the query at once, the batch in flight interrupted and replayed from the checkpoint, idempotently.
* A STOP file older than the process (left by an earlier run of the version) is removed at
  start, so a version restarted from its checkpoint does not stop at once.
* When the job ends, the end offsets of the last committed micro-batch are committed once more
  to the consumer group (the source commits after every batch; this closes the last gap).
* Logs go to stdout (the launcher redirects them to ``<run-dir>/job.log``). Spark scratch space
  is ``<run-dir>/spark-local``.

The package: `args` (the command line), `status` (status.json and `RunState`), `context`
(`JobContext` and the progress listener), `loop` (`run`: signals, heartbeat, the stop), `stopping`
(the stop gate), `stream` (Spark's Kafka source options and the triggers), `backfill` (a one-batch
backfill's read progress), `session` (the Spark session and process environment), `sparkwork` (what
the Spark work cost) and `seedjob` (what the seed jobs share around Spark).
"""
