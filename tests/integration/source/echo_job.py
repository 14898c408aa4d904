"""A tiny job for the runtime's tests: copies the Kafka records to one Parquet file per batch.

``--extra`` knobs: ``fail_at_batch`` (raise inside that micro-batch), ``fail_in_build`` (raise a
SourceError before the query starts), ``batch_sleep`` (seconds each batch takes).
Run: ``python -m tests.integration.source.echo_job --pipeline echo --version 1 ...``.
"""

from __future__ import annotations

import time
from pathlib import Path

from jobs.lib.runtime.context import JobContext
from jobs.lib.runtime.loop import run
from jobs.lib.runtime.stopping import GATE
from orchestrator.core.exceptions import SourceError


def build(ctx: JobContext):
    extra = ctx.extra
    if extra.get("fail_in_build"):
        raise SourceError(str(extra["fail_in_build"]))
    out = Path(ctx.args.output)
    out.mkdir(parents=True, exist_ok=True)
    ctx.rules_hash = "echo-rules-hash"

    def write(df, batch_id: int) -> None:
        import pyarrow.parquet as pq

        if extra.get("fail_at_batch") is not None and batch_id >= int(extra["fail_at_batch"]):
            raise RuntimeError(f"echo job told to fail at batch {batch_id}")
        table = df.toArrow()
        pq.write_table(table, out / f"batch-{batch_id:06d}.parquet")
        if extra.get("batch_sleep"):
            time.sleep(float(extra["batch_sleep"]))
        ctx.record_batch(batch_id, table.num_rows, table.num_rows, 0, rejects_total=0)

    reader = ctx.spark.readStream.format("kafka")
    for k, v in ctx.kafka_options().items():
        reader = reader.option(k, v)
    return (reader.load().writeStream.foreachBatch(GATE.wrap(write))   # no work once a stop is requested
            .option("checkpointLocation", ctx.args.checkpoint)
            .trigger(**ctx.trigger_kwargs()).start())


if __name__ == "__main__":
    run(build)
