"""A change batch committed as one Iceberg row delta whose cost tracks the batch, not the table.

The batch's keys are looked up in the table's key index (``key_index``), not joined with the
table, which tells which rows the batch replaces (its updates and deletes), where they are (data
file and position), and whether the batch's change is older than the row (the order column's
guard). One commit then adds the batch's new rows and a position delete file per table partition
for exactly the rows it replaces: Iceberg's ``RowDelta``, through py4j (PySpark has no API for
it), validated against the branch head the committer expects and against the data files it
deletes from (a compaction meanwhile fails the commit instead of deleting from rewritten files),
carrying the ``lakehouse.*`` summary keys. Readers see position deletes, as after a merge-on-read
``MERGE``, and no equality deletes.

The new rows are written by Spark into a staged snapshot (``staged_snapshots``), whose data files
the row delta adds; their positions are then read back (PyArrow, through the table's FileIO) into
the key index. The counts of what the batch inserts, updates and deletes come from the same
lookup, not from a second join. Delete files are written through the table's own FileIO, so the
table may live on a mounted path or an object store alike.
"""

from __future__ import annotations

import logging
import re
import shutil
import uuid
from collections import defaultdict
from types import TracebackType

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from py4j.java_gateway import JavaObject
from pyiceberg.io import FileIO
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession

from lakehouse_assets import faults
from lakehouse_assets.batches.staged_format import DELETE, OPERATION_COLUMN
from lakehouse_assets.catalog.staged_snapshots import allow_staged_snapshots, staged_snapshot_id, write_staged
from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.commit.fenced_pass import CommitterPass
from lakehouse_assets.commit.key_index import (
    FILE,
    ORDER,
    POSITION,
    IndexState,
    KeyIndex,
    parquet_scan,
    sql_name,
    sql_string,
)
from lakehouse_assets.commit.recovery import MAIN_BRANCH, branch_head_id
from lakehouse_assets.commit.table_writes import ChangeCounts
from lakehouse_assets.commit.tables import identifier_columns
from lakehouse_assets.config.spec import SOURCE_POSITION_COLUMN, SOURCE_POSITION_TYPE, StreamSpec
from lakehouse_assets.errors import CommitConflictError, FencedError, LakehouseError, TableNotFoundError
from lakehouse_assets.faults import crash_point
from lakehouse_assets.jvm.spark_jvm import is_validation_failure
from lakehouse_assets.jvm.spark_jvm import jvm as spark_jvm
from lakehouse_assets.lakehouse import Lakehouse

# Iceberg's reserved field ids of a position delete file's two columns (the table spec).
DELETE_FILE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": b"2147483546"}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"2147483545"}),
    ]
)
logger = logging.getLogger(__name__)


def uses_row_deltas(table: Table) -> bool:
    """Whether a change batch commits to ``table`` as a row delta: a format-2 table whose merges are
    merge-on-read (its readers expect position deletes), on a mounted path or an object store
    alike (its files are written and read through the table's FileIO). Other tables keep ``MERGE
    INTO`` (format 3 writes deletion vectors there; copy-on-write rewrites files)."""
    return table.metadata.format_version == 2 and table.properties.get("write.merge.mode") == "merge-on-read"


def refresh_key_index(spark: SparkSession, lake: Lakehouse, stream: StreamSpec, branch: str) -> bool:
    """Rebuild the key index of a change stream's table when it does not describe the head of
    ``branch`` (after compaction renumbered the rows), so that the next batch does not pay for
    it; whether it was rebuilt. The caller holds the table's lock."""
    table = lake.table(stream.table_identifier)
    if table is None or not stream.applies_changes or not uses_row_deltas(table):
        return False
    index = KeyIndex.of(lake, stream.table_identifier, identifier_columns(lake, stream), stream.order_column)
    head = branch_head_id(table, branch)
    if index.kept(table, head) is not None:
        return False
    index.rebuild(spark, table, head)
    return True


class StaleIndexError(LakehouseError):
    """The key index names data files that the snapshot it describes does not hold."""


# The columns of the lookup's own tables, in the reserved prefix: a key column may be named anything else.
CHANGE_OPERATION = "_lakehouse_change_operation"
APPLIES = "_lakehouse_applies"


class ChangeBatchDelta:
    """One change batch's row delta into one table, on a Spark session of its own (the staged
    write's settings must reach no other thread's write): its changes (keys, operation, order
    value) kept as Parquet for DuckDB, planned against the key index, written, committed and
    indexed. A context manager: entering it writes the changes, leaving it removes them."""

    def __init__(
        self,
        spark: SparkSession,
        lake: Lakehouse,
        identifier: str,
        changes: DataFrame,
        keys: list[str],
        columns: list[str],
        order_column: str | None,
    ) -> None:
        self.spark = spark
        self.lake = lake
        self.identifier = identifier
        self.changes = changes
        self.columns = columns
        self.keys = keys
        self.order_column = order_column
        self.index = KeyIndex.of(lake, identifier, keys, order_column)
        # Inside the index's directory, whose updates remove what a killed process left there.
        self.workspace = self.index.directory / f"work-{uuid.uuid4().hex}"
        self.connection = duckdb.connect()
        self.base: IndexState | None = None
        self.counts = ChangeCounts(0, 0, 0)

    def __enter__(self) -> ChangeBatchDelta:
        try:
            ordered = [self.order_column] if self.order_column else []
            written = self.workspace / "changes"
            self.changes.select(*self.keys, OPERATION_COLUMN, *ordered).write.parquet(str(written))
            self.connection.execute(
                f"CREATE TEMP VIEW changes AS SELECT * FROM {parquet_scan([str(written / '*.parquet')])}"
            )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.connection.close()
        shutil.rmtree(self.workspace, ignore_errors=True)

    def plan(self, table: Table, head: int | None, rebuild: bool = False) -> ChangeCounts:
        """Look the batch's keys up in the index of ``table`` at ``head`` (the branch head the
        commit will validate from; rebuilt first when ``rebuild``): the rows it replaces, and what
        it inserts, updates, deletes and skips as stale."""
        state = self.index.rebuild(self.spark, table, head) if rebuild else self.index.current(self.spark, table, head)
        try:
            self._match(state)
        except (duckdb.IOException, duckdb.InvalidInputException):
            # A segment that no longer reads as Parquet (a damaged disk, a hand edit): rebuild.
            state = self.index.rebuild(self.spark, table, head)
            self._match(state)
        keys = ", ".join(sql_name(k) for k in self.keys)
        self.connection.execute(
            f"CREATE OR REPLACE TEMP TABLE matched_keys AS SELECT {keys}, any_value({CHANGE_OPERATION}) AS "
            f"{CHANGE_OPERATION}, bool_and({APPLIES}) AS {APPLIES} FROM matched GROUP BY {keys}"
        )
        row = self.connection.execute(
            f"SELECT (SELECT count(*) FROM changes WHERE {OPERATION_COLUMN} <> '{DELETE}') "
            f"- count(*) FILTER (WHERE {CHANGE_OPERATION} <> '{DELETE}'), "
            f"count(*) FILTER (WHERE {APPLIES} AND {CHANGE_OPERATION} <> '{DELETE}'), "
            f"count(*) FILTER (WHERE {APPLIES} AND {CHANGE_OPERATION} = '{DELETE}'), "
            f"count(*) FILTER (WHERE NOT {APPLIES}) FROM matched_keys"
        ).fetchone()
        if row is None:
            raise LakehouseError(f"table {self.identifier}: the key lookup returned nothing")
        self.base = state
        self.counts = ChangeCounts(inserted=int(row[0]), updated=int(row[1]), deleted=int(row[2]), stale=int(row[3]))
        return self.counts

    def _match(self, state: IndexState) -> None:
        """``matched``: each live row of the index whose key the batch changes, with its position
        and whether the change applies (is not older than the row by the order column)."""
        on = " AND ".join(f"c.{sql_name(k)} = e.{sql_name(k)}" for k in self.keys)
        if self.order_column:
            change_order, row_order = f"c.{sql_name(self.order_column)}", f"e.{ORDER}"
            change_key, row_key = (ordered_as_spark(side, self.order_column) for side in (change_order, row_order))
            applies = f"({row_order} IS NULL OR {change_order} IS NULL OR {change_key} >= {row_key})"
        else:
            applies = "true"
        key_list = ", ".join(f"c.{sql_name(k)}" for k in self.keys)
        self.connection.execute(
            f"CREATE OR REPLACE TEMP TABLE matched AS SELECT {key_list}, c.{OPERATION_COLUMN} AS {CHANGE_OPERATION}, "
            f"e.{FILE}, e.{POSITION}, {applies} AS {APPLIES} "
            f"FROM changes c JOIN {self.index.live_rows_sql(state)} e ON {on}"
        )

    def _replan(self, table: Table, head: int | None, rebuild: bool = False) -> None:
        """Plan again against ``head``; FencedError when the batch's effect changed meanwhile
        (another writer changed its rows)."""
        planned = self.counts
        if self.plan(table, head, rebuild) != planned:
            raise FencedError(f"table {self.identifier}: the rows of this change batch changed while it committed")

    def commit(self, committer: CommitterPass, properties: dict[str, str]) -> None:
        """Write the batch's deletes and new rows and commit them to the pass's branch in one row
        delta carrying ``properties``, then bring the key index to the new snapshot. Plans again
        when the branch moved since the last plan (after a commit conflict); a commit Iceberg's
        checks refuse (the table changed under it) raises CommitConflictError, which the committer
        retries. Called as the pass's write, right after its fence read the table: that read is
        the one planned from (no load of its own, a round trip fewer on a REST catalog), and the
        Java table's head, read below, catches a commit since."""
        branch, table = committer.branch, committer.table()
        if table is None:
            raise TableNotFoundError(f"table {self.identifier} does not exist")
        head = branch_head_id(table, branch)
        if self.base is None or self.base.snapshot_id != head:
            self._replan(table, head)
        jtable = self._java_table()
        if _java_head(jtable, branch) != head:
            raise CommitConflictError(f"table {self.identifier}: {branch} moved while this batch committed")
        try:
            deletes, referenced = self._write_delete_files(jtable, head)
        except StaleIndexError:
            # Files the index names are gone from the snapshot it claims to describe: rebuild it.
            self._replan(table, head, rebuild=True)
            deletes, referenced = self._write_delete_files(jtable, head)
        added = self._write_new_rows(table, jtable)
        crash_point(faults.ROW_DELTA_AFTER_DELETE_FILES)
        delta = jtable.newRowDelta()
        for data_file in added:
            delta.addRows(data_file)
        for delete_file in deletes:
            delta.addDeletes(delete_file)
        if head is not None:
            delta.validateFromSnapshot(head)
            delta.validateDataFilesExist(self._java_list(referenced))
            delta.validateDeletedFiles()
            delta.validateNoConflictingDeleteFiles()
            delta.validateNoConflictingDataFiles()
        for key, value in properties.items():
            delta.set(key, value)
        if branch != MAIN_BRANCH:
            delta.toBranch(branch)
        try:
            delta.commit()
        except Exception as error:
            if is_validation_failure(error):
                raise CommitConflictError(f"table {self.identifier}: {error}") from error
            raise
        crash_point(faults.ROW_DELTA_AFTER_COMMIT)
        committed = _java_head(jtable, branch)
        # The index moves to the commit's snapshot only when nothing landed between its base and it.
        if committed is not None and jtable.snapshot(committed).parentId() == head:
            try:
                self._index_commit(committed, added, table.io)
            except Exception as error:  # noqa: BLE001 - the batch has landed; the index is only derived
                # Not raised: the caller would find the batch in the ancestry and say nothing.
                logger.warning(
                    "table %s: the key index was not brought to snapshot %s (%s); the next change batch "
                    "rebuilds it from the table",
                    self.identifier,
                    committed,
                    error,
                    exc_info=True,
                )

    # -- the parts of a commit -------------------------------------------------------------------

    def _java_table(self) -> JavaObject:
        jtable = spark_jvm(self.spark).org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            self.spark._jsparkSession, qualified_name(self.identifier)
        )
        jtable.refresh()
        return jtable

    def _java_list(self, items: list[str]) -> JavaObject:
        java_list = spark_jvm(self.spark).java.util.ArrayList()
        for item in items:
            java_list.add(item)
        return java_list

    def _write_new_rows(self, table: Table, jtable: JavaObject) -> list[JavaObject]:
        """Write the rows the batch upserts (its changes that are not deletes and not stale) into a
        staged snapshot; their data files."""
        if self.counts.inserted + self.counts.updated == 0:
            return []
        rows = self.changes.where(f"{OPERATION_COLUMN} <> '{DELETE}'")
        if self.counts.stale:
            stale = self.connection.execute(
                f"SELECT {', '.join(sql_name(k) for k in self.keys)} FROM matched_keys WHERE NOT {APPLIES}"
            ).to_arrow_table()
            stale_path = self.workspace / f"stale-{uuid.uuid4().hex}.parquet"
            pq.write_table(stale, stale_path)
            rows = rows.join(self.spark.read.parquet(str(stale_path)), on=self.keys, how="left_anti")
        allow_staged_snapshots(self.spark, table, self.identifier)
        wap_id = f"row-delta:{uuid.uuid4().hex}"
        write_staged(rows.select(*[f"`{c}`" for c in self.columns]), self.identifier, wap_id)
        staged = staged_snapshot_id(self.lake.table(self.identifier), self.identifier, wap_id)
        jtable.refresh()
        files = jtable.snapshot(staged).addedDataFiles(jtable.io()).iterator()
        added = []
        while files.hasNext():
            added.append(files.next())
        return added

    def _write_delete_files(self, jtable: JavaObject, head: int | None) -> tuple[list[JavaObject], list[str]]:
        """One position delete file per table partition for the rows the batch replaces, beside
        the table's data files (on a mounted path or an object store); the delete files and the
        data files they delete from. StaleIndexError when the snapshot ``head`` lacks a data file
        the index names."""
        deleted = self.connection.execute(
            f"SELECT m.{FILE} AS file_path, m.{POSITION} AS pos FROM matched m JOIN matched_keys k USING ("
            + ", ".join(sql_name(k) for k in self.keys)
            + f") WHERE k.{APPLIES} ORDER BY file_path, pos"
        ).to_arrow_table()
        self.connection.register("deleted_positions", deleted)
        referenced = sorted(set(deleted.column("file_path").to_pylist()))
        if not referenced or head is None:
            return [], []
        jvm = spark_jvm(self.spark)
        by_partition: dict[tuple[int, str], list[str]] = defaultdict(list)
        data_files = _data_files(jvm, jtable, head, set(referenced))
        if missing := set(referenced) - set(data_files):
            raise StaleIndexError(
                f"table {self.identifier}: the key index names data files that snapshot {head} does not hold: "
                f"{sorted(missing)[:3]}"
            )
        for location, data_file in data_files.items():
            spec = jtable.specs().get(data_file.specId())
            by_partition[(data_file.specId(), spec.partitionToPath(data_file.partition()))].append(location)
        io, metrics_config = jtable.io(), jvm.org.apache.iceberg.MetricsConfig.forPositionDelete(jtable)
        delete_files = []
        for locations in by_partition.values():
            sample = data_files[locations[0]]
            spec = jtable.specs().get(sample.specId())
            name, locations_of = f"{uuid.uuid4().hex}-deletes.parquet", jtable.locationProvider()
            # An unpartitioned spec's partition path is empty: the partitioned form would put an
            # empty segment ("data//name") in the key, which an S3 store refuses to sign for.
            location = (
                locations_of.newDataLocation(spec, sample.partition(), name)
                if spec.isPartitioned()
                else locations_of.newDataLocation(name)
            )
            positions = self.connection.execute(
                "SELECT file_path, pos FROM deleted_positions WHERE file_path IN "
                f"({', '.join(sql_string(loc) for loc in locations)}) ORDER BY file_path, pos"
            ).to_arrow_table()
            written = pa.BufferOutputStream()
            pq.write_table(positions.cast(DELETE_FILE_SCHEMA), written)
            content = written.getvalue().to_pybytes()
            # Through the table's own FileIO, Spark's: its retries and its single PUT for a small
            # object on a store (PyArrow's S3 client uploads in parts, whose completion a
            # throttled store may refuse). The name is new (a uuid), so nothing is overwritten.
            stream = io.newOutputFile(location).createOrOverwrite()
            try:
                stream.write(content)
            finally:
                stream.close()
            builder = (
                jvm.org.apache.iceberg.FileMetadata.deleteFileBuilder(spec)
                .ofPositionDeletes()
                .withPath(location)
                .withFormat("parquet")
                .withFileSizeInBytes(len(content))
                .withRecordCount(positions.num_rows)
                .withPartition(sample.partition())
                .withMetrics(
                    jvm.org.apache.iceberg.parquet.ParquetUtil.fileMetrics(io.newInputFile(location), metrics_config)
                )
            )
            if len(locations) == 1:
                builder = builder.withReferencedDataFile(locations[0])
            delete_files.append(builder.build())
        return delete_files, referenced

    def _index_commit(self, snapshot_id: int, added: list[JavaObject], file_io: FileIO) -> None:
        """Bring the key index from the planned snapshot to ``snapshot_id``: the new rows' keys and
        positions (their row numbers in their data files, read with PyArrow through ``file_io``)
        in, the deleted positions out."""
        if self.base is None:
            return
        added_sql = None
        if added:
            self.connection.register("added_entries", self._entries_of([f.location() for f in added], file_io))
            added_sql = "SELECT * FROM added_entries"
        removed_sql = f"SELECT file_path AS {FILE}, pos AS {POSITION} FROM deleted_positions"
        has_removed = self.connection.execute("SELECT count(*) FROM deleted_positions").fetchone()
        self.index.record(
            self.base,
            snapshot_id,
            self.connection,
            added_sql,
            removed_sql if has_removed and has_removed[0] else None,
        )

    def _entries_of(self, locations: list[str], file_io: FileIO) -> pa.Table:
        """Index entries (keys, order value, file, position) of every row of the data files at ``locations``."""
        read = [*self.keys, *([self.order_column] if self.order_column else [])]
        parts = []
        for location in locations:
            with file_io.new_input(location).open() as data_file:
                rows = pq.read_table(data_file, columns=read)
            count = rows.num_rows
            order = rows.column(self.order_column) if self.order_column else pa.nulls(count, pa.string())
            files = pa.array([location] * count, pa.string())
            positions = pa.array(range(count), pa.int64())
            keys = [rows.column(k) for k in self.keys]
            parts.append(pa.table([*keys, order, files, positions], names=[*self.keys, ORDER, FILE, POSITION]))
        return pa.concat_tables(parts)


def _java_head(jtable: JavaObject, branch: str) -> int | None:
    """The id of the head of ``branch`` in the Java table as it last read or committed it."""
    ref = jtable.refs().get(branch)
    return None if ref is None else int(ref.snapshotId())


def ordered_as_spark(value: str, order_column: str) -> str:
    """SQL comparing as Spark compares ``value`` of the order column. A source position is a struct
    whose fields a NULL may hold (Postgres has no file, MySQL no LSN): Spark orders a NULL field
    first, DuckDB last, so each field is compared after whether it is set."""
    if order_column != SOURCE_POSITION_COLUMN:
        return value
    fields = re.findall(r"(\w+):", SOURCE_POSITION_TYPE)
    pairs = ", ".join(
        f"set_{n} := {value}.{sql_name(name)} IS NOT NULL, value_{n} := {value}.{sql_name(name)}"
        for n, name in enumerate(fields)
    )
    return f"struct_pack({pairs})"


def _data_files(jvm: JavaObject, jtable: JavaObject, snapshot_id: int, wanted: set[str]) -> dict[str, JavaObject]:
    """The live data files of snapshot ``snapshot_id`` whose location is in ``wanted``: Iceberg's
    ``FindFiles`` matches them in its manifests, so only the matches cross into Python."""
    locations = jvm.java.util.ArrayList()
    for location in wanted:
        locations.add(location)
    iceberg = jvm.org.apache.iceberg
    matching = getattr(iceberg.expressions.Expressions, "in")("file_path", locations)
    files = getattr(iceberg, "FindFiles$Builder")(jtable).inSnapshot(snapshot_id).withMetadataMatching(matching)
    found: dict[str, JavaObject] = {}
    collected = files.collect()
    try:
        entries = collected.iterator()
        while entries.hasNext():
            data_file = entries.next()
            found[data_file.location()] = data_file.copyWithoutStats()
    finally:
        collected.close()
    return found
