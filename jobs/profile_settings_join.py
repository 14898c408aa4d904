"""Member profiles joined to member settings by member id: a table-table join of two changelogs.

    python -m jobs.profile_settings_join --topics member_profiles,member_settings ...

`--topics` names the profiles topic first, the settings topic second. Both are compacted
changelogs keyed by member id (the Kafka key, UTF-8); a tombstone (null value) deletes that side.

The Samza implementation: one key-value store keyed by member id holds the latest profile and the
latest settings; a change on either side updates its half and emits the new joined record. Here
that store is the state of `applyInPandasWithState` over the union of both topics (one source, one
read per micro-batch), grouped by the Kafka key, on the RocksDB state store with changelog
checkpointing. Within a micro-batch a side's records are applied in offset order, so the latest
record of each side wins exactly as compaction would keep it.

Emission and output: for every member touched in a micro-batch the function emits the joined
record as of the end of the batch (the intermediate joins of one batch would be overwritten by the
same upsert), and the sink upserts by member_id:

* profile present, settings present: the full row;
* profile present, no settings (never seen, or tombstoned): the row with null settings columns
  (left-outer from the profile's side: a member exists when their profile does);
* no profile (never seen, or tombstoned): the row is deleted (`_deleted`); settings that arrive
  for a member without a profile are kept in state and joined when the profile appears.

A malformed record (bad key, not JSON, wrong field type) goes to the rejects table and leaves its
side unchanged. Output table columns: member_id, name, title, company, location, zip, language,
email_notifications, visibility, profile_offset, settings_offset (offsets of the records the row
is made of).
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Iterator

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from jobs.lib.events import PROFILE, SETTINGS, decode_key, parse_value
from jobs.lib.runtime import JobContext, run
from jobs.lib.seedjob import (
    TAIL_DDL, job_options, job_topics, make_writer, reject_row, rows_frame, start_query,
)

__all__ = ["KEY_COLUMNS", "OUTPUT_SCHEMA", "OUTPUT_DDL", "join_member", "transform", "build"]

log = logging.getLogger("kappa.profile_settings_join")

KEY_COLUMNS = ["member_id"]

OUTPUT_SCHEMA = pa.schema(
    [pa.field("member_id", pa.string())]
    + list(PROFILE.arrow_schema()) + list(SETTINGS.arrow_schema())
    + [pa.field("profile_offset", pa.int64()), pa.field("settings_offset", pa.int64())]
)

STATE_DDL = "profile string, profile_offset bigint, settings string, settings_offset bigint"
OUTPUT_DDL = (
    "member_id string, " + PROFILE.spark_ddl() + ", " + SETTINGS.spark_ddl()
    + ", profile_offset bigint, settings_offset bigint, _deleted boolean, " + TAIL_DDL
)
_OUT_COLUMNS = [c.split(" ")[0] for c in OUTPUT_DDL.split(", ")]


def join_member(profiles_topic: str, settings_topic: str, key: tuple, pdfs: Iterator[pd.DataFrame],
                state: GroupState) -> Iterator[pd.DataFrame]:
    """One member's records of one micro-batch -> their joined row (or delete) and rejects.

    Runs on an executor, once per key and micro-batch; state = the latest valid value (as JSON)
    and offset of each side.
    """
    df = pd.concat(list(pdfs), ignore_index=True)
    member, key_error = decode_key(PROFILE, key[0])
    out: list[dict] = [{"input_rows": len(df)}]
    if key_error:
        out.extend(reject_row(r, decode_key(SETTINGS if r.topic == settings_topic else PROFILE, key[0])[1])
                   for r in df.itertuples(index=False))
        yield rows_frame(out, _OUT_COLUMNS)
        return
    profile, profile_offset, settings, settings_offset = (
        state.get if state.exists else (None, None, None, None))
    changed = False
    df = df.sort_values(["partition", "offset"], kind="stable")
    for r in df.itertuples(index=False):
        is_profile = r.topic == profiles_topic
        if not is_profile and r.topic != settings_topic:
            out.append(reject_row(r, f"topic {r.topic!r} is neither the profiles topic "
                                  f"{profiles_topic!r} nor the settings topic {settings_topic!r}"))
            continue
        if r.value is None:
            doc = None
        else:
            row, error = parse_value(PROFILE if is_profile else SETTINGS, member, r.value)
            if error:
                out.append(reject_row(r, error))
                continue
            doc = json.dumps(row)
        if is_profile:
            profile, profile_offset = doc, (None if doc is None else int(r.offset))
        else:
            settings, settings_offset = doc, (None if doc is None else int(r.offset))
        changed = True
    if changed:
        if profile is None and settings is None:
            state.remove()
        else:
            state.update((profile, profile_offset, settings, settings_offset))
        joined = {"member_id": member, "_deleted": profile is None}
        if profile is not None:
            joined.update(json.loads(profile), profile_offset=profile_offset)
            if settings is not None:
                joined.update(json.loads(settings), settings_offset=settings_offset)
        out.append(joined)
    yield rows_frame(out, _OUT_COLUMNS)


def transform(source: DataFrame, profiles_topic: str, settings_topic: str) -> DataFrame:
    """Kafka rows of both topics -> joined rows to upsert (`_deleted` marks deletes), rejects and
    input counts (`jobs.lib.seedjob.TAIL_DDL`)."""
    return (
        source.select("key", "value", "topic", "partition", "offset", "timestamp")
        .groupBy("key")
        .applyInPandasWithState(partial(join_member, profiles_topic, settings_topic), OUTPUT_DDL,
                                STATE_DDL, "update", GroupStateTimeout.NoTimeout)
    )


def build(ctx: JobContext) -> StreamingQuery:
    """Start the query (runtime contract): `--topics <profiles>,<settings>`, one source over both."""
    profiles, settings = job_topics(ctx, ("member profiles", "member settings"), "profile_settings_join")
    job_options(ctx, {}, "profile_settings_join")
    writer = make_writer(ctx, OUTPUT_SCHEMA, mode="upsert", key_columns=KEY_COLUMNS, log=log,
                         name="profile_settings_join")
    return start_query(ctx, lambda read: transform(read(), profiles, settings), writer, output_mode="update",
                       job="profile_settings_join")


if __name__ == "__main__":
    run(build)
