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
the row delta adds; their positions are then read back (DuckDB) into the key index. The counts of
what the batch inserts, updates and deletes come from the same lookup, not from a second join.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections import defaultdict
from types import TracebackType

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from py4j.java_gateway import JavaObject
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession

from lakehouse_assets import faults
from lakehouse_assets.catalog.staged_snapshots import allow_staged_snapshots, staged_snapshot_id, write_staged
from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.catalog.tables import identifier_columns
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
from lakehouse_assets.config import SOURCE_POSITION_COLUMN, SOURCE_POSITION_TYPE, StreamSpec
from lakehouse_assets.engine.jvm import jvm as spark_jvm
from lakehouse_assets.errors import FencedError, LakehouseError
from lakehouse_assets.faults import crash_point
from lakehouse_assets.ingest.staged_format import DELETE, OPERATION_COLUMN
from lakehouse_assets.lakehouse import Lakehouse

# Iceberg's reserved field ids of a position delete file's two columns (the table spec).
DELETE_FILE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": b"2147483546"}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"2147483545"}),
    ]
)
LOCAL_SCHEME = "file:"


def uses_row_deltas(table: Table) -> bool:
    """Whether a change batch commits to ``table`` as a row delta: a format-2 table whose merges are
    merge-on-read (its readers expect position deletes) with its files on a mounted path. Other
    tables keep ``MERGE INTO`` (format 3 writes deletion vectors there; copy-on-write rewrites files)."""
    return (
        table.metadata.format_version == 2
        and table.properties.get("write.merge.mode") == "merge-on-read"
        and local_path(table.location()) is not None
    )


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


def local_path(location: str) -> str | None:
    """The local path of a ``file:`` or plain location; None for another scheme."""
    if location.startswith(LOCAL_SCHEME):
        return "/" + location[len(LOCAL_SCHEME) :].lstrip("/")
    return location if location.startswith("/") else None


class ChangeBatchDelta:
    """One change batch's row delta into one table: its changes (keys, operation, order value)
    kept as Parquet for DuckDB, planned against the key index, written, committed and indexed.
    A context manager: leaving it removes the batch's working files."""

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
        ordered = [order_column] if order_column else []
        changes.select(*keys, OPERATION_COLUMN, *ordered).write.parquet(str(self.workspace / "changes"))
        self.connection = duckdb.connect()
        self.connection.execute(
            f"CREATE TEMP VIEW changes AS SELECT * FROM {parquet_scan([str(self.workspace / 'changes' / '*.parquet')])}"
        )
        self.base: IndexState | None = None
        self.counts = ChangeCounts(0, 0, 0)

    def __enter__(self) -> ChangeBatchDelta:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.connection.close()
        shutil.rmtree(self.workspace, ignore_errors=True)

    def plan(self, table: Table, head: int | None) -> ChangeCounts:
        """Look the batch's keys up in the index of ``table`` at ``head`` (the branch head the
        commit will validate from): the rows it replaces, and what it inserts, updates, deletes
        and skips as stale."""
        state = self.index.current(self.spark, table, head)
        try:
            self._match(state)
        except duckdb.Error:
            # A segment that no longer reads as Parquet (a damaged disk, a hand edit): rebuild.
            state = self.index.rebuild(self.spark, table, head)
            self._match(state)
        keys = ", ".join(sql_name(k) for k in self.keys)
        self.connection.execute(
            f"CREATE OR REPLACE TEMP TABLE matched_keys AS SELECT {keys}, any_value(operation) AS operation, "
            f"bool_and(applies) AS applies FROM matched GROUP BY {keys}"
        )
        row = self.connection.execute(
            f"SELECT (SELECT count(*) FROM changes WHERE {OPERATION_COLUMN} <> '{DELETE}') "
            f"- count(*) FILTER (WHERE operation <> '{DELETE}'), "
            f"count(*) FILTER (WHERE applies AND operation <> '{DELETE}'), "
            f"count(*) FILTER (WHERE applies AND operation = '{DELETE}'), "
            "count(*) FILTER (WHERE NOT applies) FROM matched_keys"
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
            newer = f"{change_key} >= {row_key}"
            applies = f"({row_order} IS NULL OR {change_order} IS NULL OR {newer})"
        else:
            applies = "true"
        key_list = ", ".join(f"c.{sql_name(k)}" for k in self.keys)
        self.connection.execute(
            f"CREATE OR REPLACE TEMP TABLE matched AS SELECT {key_list}, c.{OPERATION_COLUMN} AS operation, "
            f"e.{FILE} AS file, e.{POSITION} AS pos, {applies} AS applies "
            f"FROM changes c JOIN {self.index.live_rows_sql(state)} e ON {on}"
        )

    def commit(self, branch: str, properties: dict[str, str]) -> None:
        """Write the batch's new rows and deletes and commit them to ``branch`` in one row delta
        carrying ``properties``, then bring the key index to the new snapshot. Plans again when
        the branch moved since the last plan (a commit conflict); FencedError when the batch's
        effect would then differ (another writer changed its rows)."""
        table = self.lake.require_table(self.identifier)
        head = branch_head_id(table, branch)
        planned, previous = self.counts, self.base
        if previous is None or previous.snapshot_id != head:
            if self.plan(table, head) != planned and previous is not None:
                raise FencedError(f"table {self.identifier}: the rows of this change batch changed while it committed")
        jtable = self._java_table()
        added = self._write_new_rows(table, jtable)
        deletes, referenced = self._write_delete_files(jtable, head)
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
        for key, value in properties.items():
            delta.set(key, value)
        if branch != MAIN_BRANCH:
            delta.toBranch(branch)
        delta.commit()
        crash_point(faults.ROW_DELTA_AFTER_COMMIT)
        self._index_commit(branch_head_id(self.lake.require_table(self.identifier), branch), added)

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
                f"SELECT {', '.join(sql_name(k) for k in self.keys)} FROM matched_keys WHERE NOT applies"
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
        the table's data files; the delete files and the data files they delete from."""
        deleted = self.connection.execute(
            "SELECT m.file, m.pos FROM matched m JOIN matched_keys k USING ("
            + ", ".join(sql_name(k) for k in self.keys)
            + ") WHERE k.applies ORDER BY m.file, m.pos"
        ).to_arrow_table()
        self.connection.register("deleted_positions", deleted)
        referenced = sorted(set(deleted.column("file").to_pylist()))
        if not referenced or head is None:
            return [], []
        jvm = spark_jvm(self.spark)
        by_partition: dict[tuple[int, str], list[str]] = defaultdict(list)
        data_files = _data_files(jvm, jtable, head, set(referenced))
        for location, data_file in data_files.items():
            spec = jtable.specs().get(data_file.specId())
            by_partition[(data_file.specId(), spec.partitionToPath(data_file.partition()))].append(location)
        missing = set(referenced) - set(data_files)
        if missing:
            raise LakehouseError(
                f"table {self.identifier}: the key index names data files that snapshot {head} does not hold: "
                f"{sorted(missing)[:3]}"
            )
        io, metrics_config = jtable.io(), jvm.org.apache.iceberg.MetricsConfig.forPositionDelete(jtable)
        delete_files = []
        for locations in by_partition.values():
            sample = data_files[locations[0]]
            spec = jtable.specs().get(sample.specId())
            location = jtable.locationProvider().newDataLocation(
                spec, sample.partition(), f"{uuid.uuid4().hex}-deletes.parquet"
            )
            positions = self.connection.execute(
                "SELECT file AS file_path, pos FROM deleted_positions WHERE file IN "
                f"({', '.join(sql_string(loc) for loc in locations)}) ORDER BY file, pos"
            ).to_arrow_table()
            path = local_path(location)
            if path is None:
                raise LakehouseError(f"table {self.identifier}: cannot write a delete file to {location}")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            pq.write_table(positions.cast(DELETE_FILE_SCHEMA), path)
            builder = (
                jvm.org.apache.iceberg.FileMetadata.deleteFileBuilder(spec)
                .ofPositionDeletes()
                .withPath(location)
                .withFormat("parquet")
                .withFileSizeInBytes(os.path.getsize(path))
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

    def _index_commit(self, snapshot_id: int | None, added: list[JavaObject]) -> None:
        """Bring the key index from the planned snapshot to ``snapshot_id``: the new rows' keys and
        positions (read from their data files) in, the deleted positions out."""
        if self.base is None or snapshot_id is None:
            return
        added_sql = None
        if added:
            locations = [data_file.location() for data_file in added]
            paths = {local_path(location) or location: location for location in locations}
            self.connection.register(
                "added_files",
                pa.table({"path": list(paths), "location": list(paths.values())}),
            )
            keys = ", ".join(f"d.{sql_name(k)}" for k in self.keys)
            order = f"d.{sql_name(self.order_column)}" if self.order_column else "NULL::VARCHAR"
            files = ", ".join(sql_string(path) for path in paths)
            added_sql = (
                f"SELECT {keys}, {order} AS {ORDER}, f.location AS {FILE}, d.file_row_number AS {POSITION} "
                f"FROM read_parquet([{files}], filename = true, file_row_number = true) d "
                "JOIN added_files f ON d.filename = f.path"
            )
        removed_sql = f"SELECT file AS {FILE}, pos AS {POSITION} FROM deleted_positions"
        has_removed = self.connection.execute("SELECT count(*) FROM deleted_positions").fetchone()
        self.index.record(
            self.base,
            snapshot_id,
            self.connection,
            added_sql,
            removed_sql if has_removed and has_removed[0] else None,
        )


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
