"""The job's tables take their locations as URIs (`file:///...`, `s3a://...`) as well as paths: the
rejects table a first batch with no rejects creates empty is created at a `file://` URI too (Delta
qualifies `file:///x` to `file:/x` and refused the two as different locations)."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from jobs.lib.sink.tables import DeltaTables


def test_an_empty_rejects_table_is_created_at_a_file_uri(spark, tmp_path):
    rejects_uri = f"file://{tmp_path}/warehouse/v1__rejects"
    tables = DeltaTables(f"file://{tmp_path}/warehouse/v1", rejects_uri, "app", "member_id")
    empty = spark.createDataFrame([], "member_id string, reason string")

    tables.write_rejects(0, empty, 0)
    tables.write_rejects(1, empty, 0)       # exists now: nothing more to commit

    assert DeltaTable(rejects_uri).version() == 0
    table = spark.read.format("delta").load(rejects_uri)
    assert table.columns == ["member_id", "reason"]
    assert table.count() == 0


@pytest.mark.parametrize("left", [
    {"00000000000000000000.json": b""},                                        # an empty commit file
    {".00000000000000000000.json.5f1c.tmp": b'{"commitInfo":{"ti',            # Delta's temp file, never renamed
     "..00000000000000000000.json.5f1c.tmp.crc": b""},
])
def test_a_rejects_table_whose_create_a_full_disk_cut_short_is_created_again(spark, tmp_path, left):
    """The disk filled while the first batch created the empty rejects table (Delta's log store failed to
    close its temp file, so nothing was renamed into the log). The job restarted from its checkpoint must
    create the table, not fail on a table Delta cannot find (DELTA_TABLE_NOT_FOUND: found by the fault
    suite's disk-full scenario); a log with a commit is never touched (below)."""
    rejects_uri = f"file://{tmp_path}/warehouse/v1__rejects"
    torn = tmp_path / "warehouse" / "v1__rejects" / "_delta_log"
    torn.mkdir(parents=True)
    for name, data in left.items():
        (torn / name).write_bytes(data)
    tables = DeltaTables(f"file://{tmp_path}/warehouse/v1", rejects_uri, "app", "member_id")
    empty = spark.createDataFrame([], "member_id string, reason string")

    tables.write_rejects(0, empty, 0)

    assert DeltaTable(rejects_uri).version() == 0
    assert spark.read.format("delta").load(rejects_uri).count() == 0


def test_a_log_with_a_commit_is_never_cleared(spark, tmp_path):
    from jobs.lib.sink.tables import clear_torn_create

    table = f"file://{tmp_path}/t"
    spark.createDataFrame([("m1", "x")], "member_id string, reason string").write.format("delta").save(table)
    assert clear_torn_create(spark, table) is False
    assert DeltaTable(table).version() == 0
    assert clear_torn_create(spark, f"file://{tmp_path}/nothing-here") is False


def test_an_empty_rejects_table_has_the_schema_a_write_of_rejects_gives_it(spark, tmp_path):
    """Found by the fault suite, with a seed whose backfill had no reject: the rejects table a first batch
    without rejects creates took the batch's schema as it was, its ``batch_id`` (a literal) NOT NULL,
    where a write of rejects makes every column nullable. One table's schema hung on the data's chance
    (and the oracle refused it: "batch_id is int64 not null")."""
    from pyspark.sql import functions as F

    from orchestrator.core.tables import read_table
    from tests.served import REJECTS_SCHEMA

    def rejects(rows: list) -> object:   # the job's rejects: the source's columns, the reason, the batch id
        return (spark.createDataFrame(rows, "key binary, value binary, topic string, partition int, offset bigint, "
                                            "error string").withColumn("batch_id", F.lit(0).cast("long")))

    assert not rejects([]).schema["batch_id"].nullable
    empty, written = f"{tmp_path}/empty__rejects", f"{tmp_path}/written__rejects"
    DeltaTables(f"{tmp_path}/empty", empty, "app", "member_id").write_rejects(0, rejects([]), 0)
    DeltaTables(f"{tmp_path}/written", written, "app", "member_id").write_rejects(
        0, rejects([(b"m1", b"{", "t", 0, 7, "invalid JSON")]), 1)

    assert DeltaTable(empty).version() == 0 and read_table(empty).num_rows == 0
    assert read_table(empty).schema == read_table(written).schema == REJECTS_SCHEMA


def test_the_rejects_table_s_columns_are_what_each_kind_of_job_gives_its_rejects(spark, tmp_path):
    """`REJECTS_DDL`, which the table is created from before a batch's rejects are computed, is the schema
    both kinds of job give them (an `Upserts` job's `batch_rejects`, a stateful job's `TAIL_DDL` rows), and
    a table created from it reads as the served rejects schema."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from jobs.lib.contract.runner import batch_rejects, group_batch
    from jobs.lib.runtime.seedjob import REJECT_COLUMNS, TAIL_DDL
    from jobs.lib.sink.tables import REJECTS_DDL, nullable
    from orchestrator.core.tables import read_table
    from tests.served import REJECTS_SCHEMA

    expected = nullable(StructType.fromDDL(REJECTS_DDL))
    rows = spark.createDataFrame([(b"m1", b"{", "t", 0, 7, None, "m1", "invalid JSON")],
                                 "key binary, value binary, topic string, partition int, offset bigint, "
                                 "timestamp timestamp, member_id string, error string")
    upserts = batch_rejects(group_batch(rows, ["member_id"], "member_id", "partition")) \
        .withColumn("batch_id", F.lit(0).cast("long"))
    stateful = spark.createDataFrame([], TAIL_DDL).select(*REJECT_COLUMNS, F.lit(0).cast("long").alias("batch_id"))
    assert nullable(upserts.schema) == nullable(stateful.schema) == expected

    tables = DeltaTables(f"{tmp_path}/v1", f"{tmp_path}/v1__rejects", "app", "member_id")
    tables.ensure_rejects(spark, StructType.fromDDL(REJECTS_DDL))
    assert tables.rejects_found and read_table(f"{tmp_path}/v1__rejects").schema == REJECTS_SCHEMA


class _Batches:
    """A `MicroBatches` whose prepare is given by the test, over a batch with nothing to write."""

    @staticmethod
    def make(spark, tmp_path, prepare, rejects_uri: str):
        from types import SimpleNamespace

        from jobs.lib.sink.batches import MicroBatches, Prepared

        class Probe(MicroBatches):
            def prepare(self, batch, batch_id):
                prepare()
                empty = spark.createDataFrame([], "member_id string")
                return Prepared(rows_in=0, rejects=empty, n_rejects=0, output=empty, rows_out=0, held=[])

            def write(self, batch_id, output, rows):
                pass

        args = SimpleNamespace(checkpoint=str(tmp_path / "ck"), extra={})
        return Probe(args, DeltaTables(f"{tmp_path}/v1", rejects_uri, "app", "member_id"), name="probe")


def test_a_first_batch_creates_the_rejects_table_while_it_is_read(spark, tmp_path):
    """The create (a JVM's first Delta commit, about 2 s) runs beside the batch's read, not after it: the
    batch's prepare waits for the table to appear, which it could not while the create came after it."""
    from tests.waiting import wait_until

    rejects = f"{tmp_path}/v1__rejects"
    seen = []

    def prepare():
        seen.append(wait_until(lambda: DeltaTable.is_deltatable(rejects), "the rejects table, created beside the "
                                                                           "read", 60, poll=0.1))
    batches = _Batches.make(spark, tmp_path, prepare, rejects)
    batches(spark.createDataFrame([], "key binary"), 0)
    assert seen == [True] and DeltaTable(rejects).version() == 0
    assert batches.tables.rejects_found
    batches(spark.createDataFrame([], "key binary"), 1)   # found: no second create, nothing committed
    assert DeltaTable(rejects).version() == 0


def test_a_create_that_fails_fails_the_batch_and_the_batch_s_own_error_comes_first(spark, tmp_path):
    """The create's error is raised by the batch (before anything is written); when the read failed too,
    the read's error is the one raised."""
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    rejects = f"{blocked}/v1__rejects"     # below a regular file: nothing can be created there

    with pytest.raises(Exception) as failed:
        _Batches.make(spark, tmp_path, lambda: None, rejects)(spark.createDataFrame([], "key binary"), 0)
    assert "a-file" in str(failed.value)

    def read_fails():
        raise RuntimeError("the read failed")
    with pytest.raises(RuntimeError, match="the read failed"):
        _Batches.make(spark, tmp_path, read_fails, rejects)(spark.createDataFrame([], "key binary"), 0)
