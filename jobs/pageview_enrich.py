"""Page views enriched with the member's ZIP code: a stream-table join against the profiles changelog.

    [pipelines.pageview_enrich]  job = "pageview_enrich", topics = ["page_views", "member_profiles"]

A job of the contract (`jobs.lib.contract.api`): ``transform(job)`` returns `Stateful` rows, appended;
its stateful function sees the raw records, so it emits its rejects and counts among its rows
(`jobs.lib.runtime.seedjob.TAIL_DDL`). The pipeline's topics name the page views topic first, the profiles
topic second; both keyed by member id
(co-partitioned, as the Samza pattern requires). The Samza implementation: a key-value store maps
member id -> ZIP code; a profile update writes it, a page view reads it and is emitted with it.
Here the store is the state of `applyInPandasWithState` over the union of both topics (one source,
one read per micro-batch), grouped by the Kafka key, on RocksDB with changelog checkpointing.

"The ZIP code as of the view": both topics are one log per member in which each topic keeps its
offset order, and the two are interleaved by record timestamp. A view gets the `zip` of the latest
profile record at or before its timestamp, or null when there is none, the latest is a tombstone,
or the profile has no ZIP code. Tie rule: a profile record and a view with the same timestamp
(millisecond) are ordered profile first, so the view sees that profile.

What holds when:

* Reprocess (the backfill of a new version): the source reads the whole log up to the deploy's end
  offsets as ONE micro-batch (source option ``backfill=one-batch``, the default), so every view is
  interleaved with every profile record of its member: each view joins the profile as it was at
  the view's time, which is what the live job saw when the view arrived. (With capped batches the
  few profile records ran ahead of the many views and later views got ZIP codes from their future.)
* Live tail: micro-batches of at most ``maxOffsetsPerTrigger`` records; inside a batch the same
  timestamp interleave holds, across batches the order is the batch order: a profile update that
  is read in a later micro-batch than a view does not change that view (it was already emitted).
  While the tail keeps up, a batch holds what arrived in one trigger interval, so this is the
  arrival order. A tail with a backlog larger than one batch shares the cap equally between the
  partitions of both topics, so the sparser profiles can run ahead of the views within that
  backlog (restarting from a new checkpoint, i.e. a reprocess, restores the as-of join).
* ``backfill=capped`` gives up the as-of guarantee for the backfill (batch order again).

The output is append-only: every valid view exactly once, idempotent per micro-batch in Delta.

Output table columns: view_id, member_id, page, viewed_at, zip, source_partition, source_offset (the
view's position). Malformed views and profiles go to the rejects table; a malformed profile
leaves the ZIP code unchanged.
"""

from __future__ import annotations

import heapq
from functools import partial
from typing import Iterator

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from jobs.lib.contract.api import JobInput, Stateful
from jobs.lib.runtime.seedjob import TAIL_DDL, duration_options, reject_row, rows_frame, topic_roles
from jobs.lib.source.events import PAGE_VIEW, PROFILE, decode_key, parse_value

__all__ = ["OUTPUT_SCHEMA", "OUTPUT_DDL", "enrich_member", "enrich", "transform"]

OUTPUT_SCHEMA = pa.schema([
    pa.field("view_id", pa.string()),
    pa.field("member_id", pa.string()),
    pa.field("page", pa.string()),
    pa.field("viewed_at", pa.timestamp("us", tz="UTC")),
    pa.field("zip", pa.string()),
    pa.field("source_partition", pa.int32()),
    pa.field("source_offset", pa.int64()),
])

STATE_DDL = "zip string"
OUTPUT_DDL = ("view_id string, member_id string, page string, viewed_at timestamp, zip string, "
              "source_partition int, source_offset bigint, " + TAIL_DDL)
_OUT_COLUMNS = [c.split(" ")[0] for c in OUTPUT_DDL.split(", ")]


def transform(job: JobInput) -> Stateful:
    """The job contract's function: topics page views then profiles, one source over both; no options."""
    views, profiles = topic_roles(job, ("page views", "member profiles"), "pageview_enrich")
    duration_options(job, {}, "pageview_enrich")
    # Source: one Kafka stream over both topics.
    source = job.source
    # Transformation: each view with the member's ZIP code as of its time, from the state of
    # applyInPandasWithState grouped by the Kafka key.
    rows = enrich(source, views, profiles)
    # Sink: the enriched views appended; the rows carry their own rejects and counts (`TAIL_DDL`).
    return Stateful(rows, output_mode="append", write="append")


def enrich(source: DataFrame, views_topic: str, profiles_topic: str) -> DataFrame:
    """Kafka rows of both topics -> enriched views to append, rejects and input counts
    (`jobs.lib.runtime.seedjob.TAIL_DDL`)."""
    return (
        source.select("key", "value", "topic", "partition", "offset", "timestamp")
        .groupBy("key")
        .applyInPandasWithState(partial(enrich_member, views_topic, profiles_topic), OUTPUT_DDL,
                                STATE_DDL, "append", GroupStateTimeout.NoTimeout)
    )


def enrich_member(views_topic: str, profiles_topic: str, key: tuple, pdfs: Iterator[pd.DataFrame],
                  state: GroupState) -> Iterator[pd.DataFrame]:
    """One member's views and profile records of one micro-batch -> enriched views and rejects.

    Runs on an executor, once per key and micro-batch; state = the member's current ZIP code
    (absent when unknown).
    """
    df = pd.concat(list(pdfs), ignore_index=True)
    member, key_error = decode_key(PAGE_VIEW, key[0])
    out: list[dict] = [{"input_rows": len(df)}]
    if key_error:
        out.extend(reject_row(r, decode_key(PROFILE if r.topic == profiles_topic else PAGE_VIEW, key[0])[1])
                   for r in df.itertuples(index=False))
        yield rows_frame(out, _OUT_COLUMNS)
        return
    zip_code = state.get[0] if state.exists else None
    df = df.sort_values(["partition", "offset"], kind="stable")
    ts = df["timestamp"].to_numpy(dtype="datetime64[ns]").astype("int64")  # order only; no timestamp first
    rank = df["topic"].map({profiles_topic: 0, views_topic: 1}).fillna(2).astype("int64")
    df = df.assign(order_ts=ts, order_rank=rank)
    per_topic = [list(g.itertuples(index=False)) for _, g in df.groupby("order_rank", sort=True)]
    for r in heapq.merge(*per_topic, key=lambda r: (r.order_ts, r.order_rank)):
        if r.order_rank == 0:
            if r.value is None:
                zip_code = None
                continue
            row, error = parse_value(PROFILE, member, r.value)
            if error:
                out.append(reject_row(r, error))
            else:
                zip_code = row["zip"]
        elif r.order_rank == 1:
            row, error = parse_value(PAGE_VIEW, member, r.value)
            if error:
                out.append(reject_row(r, error))
            else:
                out.append({"view_id": row["view_id"], "member_id": member, "page": row["page"],
                            "viewed_at": row["viewed_at"], "zip": zip_code,
                            "source_partition": int(r.partition), "source_offset": int(r.offset)})
        else:
            out.append(reject_row(r, f"topic {r.topic!r} is neither the page views topic "
                                  f"{views_topic!r} nor the profiles topic {profiles_topic!r}"))
    if zip_code is None:
        state.remove()
    else:
        state.update((zip_code,))
    yield rows_frame(out, _OUT_COLUMNS)
