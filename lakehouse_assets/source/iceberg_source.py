"""The Iceberg CDC source: a source table's changes, snapshot by snapshot, as change events.

Events land in the stream's landing directory, so the same staging, committer and checks as any
stream apply them to the downstream table. Per source snapshot, in ancestry order:

- the initial load (unless ``disable_export``) is a full scan of the current snapshot: an upsert
  per row, plus a delete per downstream key the source no longer has (so a reload after an expired
  checkpoint converges too);
- a ``replace`` snapshot (compaction) changes nothing;
- otherwise the changes come from Spark's ``create_changelog_view`` (carryover removed, updates
  computed from the identifier columns). Iceberg 1.10's changelog scans fail on a table that has
  delete files (merge-on-read), for any snapshot; such a snapshot is compared with its parent by
  time travel instead, limited to the partitions it touched (rows in one and not the other,
  matched on the identifier columns).

Each event is the row plus ``iceberg_operation``, ``iceberg_table_name``, ``iceberg_snapshot_id``,
``document_id`` and ``bulk_action`` (INDEX or DELETE): one event per key and snapshot.

Exactly once: a snapshot's events are written once into a hidden directory, published into the
landing directory under names fixed by the snapshot (exclusive hard links) and only then recorded
as the stream's source cursor (``staging/<stream>/source.json``). A crash anywhere re-publishes the
same files, never new ones; the downstream commit records the newest source snapshot it applied
(``lakehouse.source-snapshot``).
"""

from __future__ import annotations

import json
import operator
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from functools import reduce

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot
from pyiceberg.transforms import BucketTransform, IdentityTransform, TruncateTransform
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import LANDING_SUFFIX, landing_dir, source_file_prefix
from lakehouse_assets.catalog.iceberg_types import iceberg_type_name
from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.config.spec import ColumnSpec, StreamSpec
from lakehouse_assets.errors import LakehouseError, SourceCheckpointError
from lakehouse_assets.faults import crash_point
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.locks import exclusive_lock, stream_lock_file
from lakehouse_assets.paths import LakehousePaths

CURSOR_FILE = "source.json"
INSERT, DELETE, UPDATE_AFTER = "INSERT", "DELETE", "UPDATE_AFTER"
EMITTED_OPERATIONS = (INSERT, UPDATE_AFTER, DELETE)
"""UPDATE_BEFORE is not emitted: an update is one UPDATE_AFTER (bulk action INDEX) per key."""
METADATA_FIELDS = ("iceberg_operation", "iceberg_table_name", "iceberg_snapshot_id", "document_id", "bulk_action")
MAX_PUSHED_PARTITIONS = 1000
"""Above this many touched partitions the comparison reads every file rather than build a filter."""
DOCUMENT_ID_SEPARATOR = "-"
"""``document_id`` joins the identifier columns' values with this, as in the CDC source RFC."""


@dataclass(frozen=True)
class SourceCursor:
    """The last source snapshot whose events are in the landing directory."""

    snapshot_id: int
    sequence_number: int | None
    """None on a format-v1 table, whose snapshots have no sequence number."""


@dataclass(frozen=True)
class EmittedSnapshot:
    """What one source snapshot produced: its kind (load, changes or nothing) and events per operation."""

    snapshot_id: int
    kind: str
    events: dict[str, int]
    files: list[str]


def read_cursor(paths: LakehousePaths, stream: StreamSpec) -> SourceCursor | None:
    path = paths.staging(stream.name) / CURSOR_FILE
    return SourceCursor(**json.loads(path.read_text())) if path.exists() else None


def _write_cursor(paths: LakehousePaths, stream: StreamSpec, cursor: SourceCursor) -> None:
    path = paths.staging(stream.name) / CURSOR_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{CURSOR_FILE}.{uuid.uuid4().hex}.tmp")
    temporary.write_text(json.dumps(asdict(cursor)))
    os.replace(temporary, path)


def forget_cursor(paths: LakehousePaths, stream: StreamSpec) -> None:
    """Make the next source run start with an initial load (after an expired checkpoint)."""
    (paths.staging(stream.name) / CURSOR_FILE).unlink(missing_ok=True)


def load_source_table(lake: Lakehouse, stream: StreamSpec) -> Table | None:
    """The source table as last committed (PyIceberg, no JVM), from its own catalog if it has one."""
    return lake.source(stream).table(stream.source_table.table)


def source_table(lake: Lakehouse, stream: StreamSpec) -> Table:
    table = load_source_table(lake, stream)
    if table is None:
        raise LakehouseError(f"stream {stream.name!r}: source table {stream.source_table.table} does not exist")
    return table


def source_columns(lake: Lakehouse, stream: StreamSpec) -> list[ColumnSpec]:
    """The downstream table's columns when the stream creates it: the source's, with its types."""
    schema = source_table(lake, stream).schema()
    keys = set(stream.identifier_columns or [])
    return [
        ColumnSpec(
            name=field.name, type=iceberg_type_name(field.field_type), required=field.required or field.name in keys
        )
        for field in schema.fields
    ]


def pending_snapshots(table: Table, stream: StreamSpec, cursor: SourceCursor | None) -> list[Snapshot]:
    """The source snapshots after the cursor, oldest first; raises SourceCheckpointError when the
    cursor's snapshot expired or is no longer an ancestor of the current snapshot."""
    current = table.current_snapshot()
    if cursor is None or current is None:
        return [current] if current else []
    by_id = {snapshot.snapshot_id: snapshot for snapshot in table.snapshots()}
    pending: list[Snapshot] = []
    snapshot: Snapshot | None = current
    while snapshot is not None and snapshot.snapshot_id != cursor.snapshot_id:
        pending.append(snapshot)
        snapshot = by_id.get(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    if snapshot is None:
        problem = "has expired" if cursor.snapshot_id not in by_id else "is no longer an ancestor (a rollback?)"
        raise SourceCheckpointError(
            f"stream {stream.name!r}: source {stream.source_table.table} snapshot {cursor.snapshot_id}, the last "
            f"one synced, {problem}, so the changes since cannot be computed. Re-run the initial load: "
            f"`lakehouse source reload --stream {stream.name}` (upserts every source row and deletes the "
            "downstream rows the source no longer has)"
        )
    return list(reversed(pending))


def _document_id(keys: list[str]) -> Column:
    return F.concat_ws(DOCUMENT_ID_SEPARATOR, *[F.col(f"`{key}`").cast("string") for key in keys])


def _events(rows: DataFrame, columns: list[str], operation: Column, stream: StreamSpec, snapshot_id: int) -> DataFrame:
    """One NDJSON line per row: its ``columns`` and the RFC's metadata fields."""
    keys = stream.identifier_columns or []
    data = [F.col(f"`{name}`") for name in columns]
    metadata = [
        operation.alias("iceberg_operation"),
        F.lit(stream.source_table.table).alias("iceberg_table_name"),
        F.lit(snapshot_id).alias("iceberg_snapshot_id"),
        (_document_id(keys) if keys else F.lit(None).cast("string")).alias("document_id"),
        F.when(operation == F.lit(DELETE), F.lit("DELETE")).otherwise(F.lit("INDEX")).alias("bulk_action"),
    ]
    return rows.select(F.to_json(F.struct(*data, *metadata), {"ignoreNullFields": "false"}).alias("value"))


def _spark_name(stream: StreamSpec, suffix: str = "") -> str:
    """The source table (or one of its metadata tables) as Spark names it, in the source's catalog."""
    return f"{stream.source_catalog_name}.{stream.source_table.table}{suffix}"


def _snapshot_rows(spark: SparkSession, stream: StreamSpec, snapshot_id: int) -> DataFrame:
    return spark.read.option("snapshot-id", str(snapshot_id)).table(_spark_name(stream))


def _initial_load(spark: SparkSession, lake: Lakehouse, stream: StreamSpec, snapshot: Snapshot) -> DataFrame:
    """Every row of the snapshot as an upsert, and a delete per downstream key the source lacks."""
    source = _snapshot_rows(spark, stream, snapshot.snapshot_id)
    events = _events(source, source.columns, F.lit(INSERT), stream, snapshot.snapshot_id)
    keys = stream.identifier_columns or []
    downstream = lake.table(stream.table_identifier)
    if downstream is None or downstream.current_snapshot() is None:
        return events
    if not keys:
        raise LakehouseError(
            f"stream {stream.name!r}: {stream.table_identifier} has rows already; a load without "
            "source.iceberg.identifier_columns would duplicate them"
        )
    key_columns = [F.col(f"`{key}`") for key in keys]
    gone = (
        spark.table(qualified_name(stream.table_identifier)).select(*key_columns).exceptAll(source.select(*key_columns))
    )
    return events.unionByName(_events(gone, keys, F.lit(DELETE), stream, snapshot.snapshot_id))


def _changelog(spark: SparkSession, stream: StreamSpec, snapshot: Snapshot) -> DataFrame:
    """The snapshot's changes from Spark's changelog: carryover removed, updates computed."""
    keys = stream.identifier_columns or []
    view = f"lakehouse_changelog_{stream.name}_{snapshot.snapshot_id}".replace("-", "_")
    options = f"map('start-snapshot-id', '{snapshot.parent_snapshot_id}', 'end-snapshot-id', '{snapshot.snapshot_id}')"
    if snapshot.parent_snapshot_id is None:
        options = f"map('end-snapshot-id', '{snapshot.snapshot_id}')"
    identifier_argument = f", identifier_columns => array({', '.join(repr(k) for k in keys)})" if keys else ""
    spark.sql(
        f"CALL {stream.source_catalog_name}.system.create_changelog_view(table => '{stream.source_table.table}', "
        f"options => {options}, changelog_view => '{view}', "
        f"compute_updates => {'true' if keys else 'false'}{identifier_argument})"
    )
    changes = spark.table(view).where(F.col("_change_type") != F.lit("UPDATE_BEFORE"))
    # The snapshot's columns, as far as the current schema (which the view reads) still has them.
    columns = [c for c in _snapshot_rows(spark, stream, snapshot.snapshot_id).columns if c in changes.columns]
    return _events(changes, columns, F.col("_change_type"), stream, snapshot.snapshot_id)


def _partition_term(stream: StreamSpec, table: Table, name: str, value: object) -> tuple[Column, str] | None:
    """A condition Iceberg can push into its scan that every row of partition field ``name`` =
    ``value`` meets (identity, bucket and truncate fields), with the column it reads; None otherwise."""
    for spec in table.specs().values():
        for field in spec.fields:
            if field.name != name:
                continue
            column = table.schema().find_column_name(field.source_id)
            functions = f"{stream.source_catalog_name}.system"
            if column is None:
                return None
            if isinstance(field.transform, IdentityTransform):
                return F.col(f"`{column}`") == F.lit(value), column
            if isinstance(field.transform, BucketTransform):
                bucket = F.expr(f"{functions}.bucket({field.transform.num_buckets}, `{column}`)")
                return bucket == F.lit(value), column
            if isinstance(field.transform, TruncateTransform):
                return F.expr(f"{functions}.truncate({field.transform.width}, `{column}`)") == F.lit(value), column
            return None
    return None


def _pushed_partition_filter(stream: StreamSpec, table: Table, touched: DataFrame) -> tuple[Column, set[str]] | None:
    """A filter pushed into both scans so only files that can hold rows of the touched partitions
    are read; None when some touched partition cannot be bounded this way (then all are read). It
    may keep more rows than the touched partitions (fields it cannot express are left out); the
    exact restriction is the semi-join on ``_partition`` after it."""
    partitions = touched.limit(MAX_PUSHED_PARTITIONS + 1).collect()
    if not partitions or len(partitions) > MAX_PUSHED_PARTITIONS:
        return None
    alternatives, columns = [], set()
    for partition in partitions:
        terms = [
            term
            for name, value in partition["_partition"].asDict().items()
            if value is not None and (term := _partition_term(stream, table, name, value)) is not None
        ]
        if not terms:
            return None
        alternatives.append(reduce(operator.and_, [condition for condition, _ in terms]))
        columns |= {column for _, column in terms}
    return reduce(operator.or_, alternatives), columns


def _compared_with_parent(spark: SparkSession, stream: StreamSpec, table: Table, snapshot: Snapshot) -> DataFrame:
    """A merge-on-read snapshot's changes: the table at the snapshot against its parent, in the
    partitions the snapshot touched, matched on the identifier columns."""
    keys = stream.identifier_columns or []
    if not keys:
        raise LakehouseError(
            f"stream {stream.name!r}: source snapshot {snapshot.snapshot_id} has delete files (merge-on-read), whose "
            "changes can only be computed by key; set source.iceberg.identifier_columns"
        )
    parent = snapshot.parent_snapshot_id
    if parent is None:  # a table's first snapshot has no delete files to compare through
        raise LakehouseError(f"stream {stream.name!r}: source snapshot {snapshot.snapshot_id} has no parent")
    touched = (
        spark.read.option("snapshot-id", str(snapshot.snapshot_id))
        .table(_spark_name(stream, ".entries"))
        .where(F.col("snapshot_id") == F.lit(snapshot.snapshot_id))
        .select(F.col("data_file.partition").alias("_partition"))
        .distinct()
    )
    after = _snapshot_rows(spark, stream, snapshot.snapshot_id)
    columns = after.columns
    types = {field.name: field.dataType for field in after.schema}
    partition_type = touched.schema["_partition"].dataType
    partitioned = isinstance(partition_type, StructType) and bool(partition_type.fields)
    pushed = _pushed_partition_filter(stream, table, touched) if partitioned else None

    def in_touched_partitions(rows: DataFrame) -> DataFrame:
        """The rows in the partitions the snapshot touched, with the snapshot's columns (a column
        added since is NULL in the parent's rows, as the current schema reads them)."""
        present = set(rows.columns)
        aligned = [F.col(f"`{c}`") if c in present else F.lit(None).cast(types[c]).alias(c) for c in columns]
        if not partitioned:
            return rows.select(*aligned)
        if pushed and pushed[1] <= present:
            rows = rows.where(pushed[0])
        with_partition = rows.select(*aligned, "_partition")
        matches = with_partition["_partition"].eqNullSafe(touched["_partition"])
        return with_partition.join(touched, on=matches, how="left_semi").drop("_partition")

    after = in_touched_partitions(after)
    before = in_touched_partitions(_snapshot_rows(spark, stream, parent))
    added, removed = after.exceptAll(before), before.exceptAll(after)
    key_columns = [f"`{key}`" for key in keys]
    updated_keys = added.select(*key_columns).intersect(removed.select(*key_columns))
    upserts = added.join(updated_keys.withColumn("_updated", F.lit(True)), on=keys, how="left")
    operation = F.when(F.col("_updated"), F.lit(UPDATE_AFTER)).otherwise(F.lit(INSERT))
    deletes = removed.join(updated_keys, on=keys, how="left_anti")
    snapshot_id = snapshot.snapshot_id
    return _events(upserts, columns, operation, stream, snapshot_id).unionByName(
        _events(deletes, columns, F.lit(DELETE), stream, snapshot_id)
    )


def _has_delete_files(snapshot: Snapshot) -> bool:
    """True when the table has delete files at or just before the snapshot: Iceberg 1.10's changelog
    scan then fails for every snapshot, appends included."""
    summary = snapshot.summary.additional_properties if snapshot.summary else {}
    return any(int(summary.get(key, "0")) for key in ("total-delete-files", "removed-delete-files"))


def snapshot_changes(spark: SparkSession, stream: StreamSpec, table: Table, snapshot: Snapshot) -> DataFrame:
    """The change events of one snapshot of the source ``table`` (not a load, not a compaction)."""
    if _has_delete_files(snapshot):
        return _compared_with_parent(spark, stream, table, snapshot)
    return _changelog(spark, stream, snapshot)


def _publish(
    spark: SparkSession,
    lake: Lakehouse,
    stream: StreamSpec,
    snapshot: Snapshot,
    kind: str,
) -> tuple[list[str], dict[str, int]]:
    """Write the snapshot's events once, then link them into the landing directory; returns the
    landing files and the events per operation (empty when an earlier run wrote them)."""
    # Names sort in snapshot order: by sequence number (format v2+), by commit time on v1 tables.
    prefix = source_file_prefix(snapshot.sequence_number or snapshot.timestamp_ms, kind, snapshot.snapshot_id)
    written = lake.paths.staging(stream.name) / "source" / prefix
    counts: dict[str, int] = {}
    if not (written / "_SUCCESS").exists():
        if kind == "load":
            events = _initial_load(spark, lake, stream, snapshot)
        else:
            events = snapshot_changes(spark, stream, source_table(lake, stream), snapshot)
        observation = Observation(f"source-{snapshot.snapshot_id}")
        operation = F.get_json_object("value", "$.iceberg_operation")
        observed = events.observe(
            observation, *[F.count(F.when(operation == F.lit(name), 1)).alias(name) for name in EMITTED_OPERATIONS]
        )
        observed.write.mode("overwrite").text(str(written))
        counts = {name: count for name, count in observation.get.items() if count}
        if counts.get(DELETE) and not stream.identifier_columns:
            shutil.rmtree(written)
            raise LakehouseError(
                f"stream {stream.name!r}: source snapshot {snapshot.snapshot_id} deletes or updates rows, which "
                "can only be applied by key; set source.iceberg.identifier_columns"
            )
    directory = landing_dir(lake.paths, stream)
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    parts = sorted(part for part in written.glob("part-*") if part.stat().st_size > 0)
    for index, part in enumerate(parts):
        name = f"{prefix}-{index:05d}{LANDING_SUFFIX}"
        try:
            os.link(part, directory / name)
        except FileExistsError:
            pass
        files.append(name)
    return files, counts


def emit_source_changes(spark: SparkSession, lake: Lakehouse, stream: StreamSpec) -> list[EmittedSnapshot]:
    """Land the events of every source snapshot after the cursor, in order, and advance the cursor
    after each; harmless to repeat. The first run loads the current snapshot (or, with
    ``disable_export``, only records it)."""
    with exclusive_lock(stream_lock_file(lake.paths.locks, f"{stream.name}-source")):
        table = source_table(lake, stream)
        cursor = read_cursor(lake.paths, stream)
        current = table.current_snapshot()
        if cursor is None and stream.source_table.disable_export and current is not None:
            _write_cursor(lake.paths, stream, SourceCursor(current.snapshot_id, current.sequence_number))
            return [EmittedSnapshot(current.snapshot_id, "skipped load (disable_export)", {}, [])]
        emitted = []
        for snapshot in pending_snapshots(table, stream, cursor):
            if cursor is None:
                kind = "load"
            elif snapshot.summary and snapshot.summary.operation == Operation.REPLACE:
                kind = "none"  # compaction: the same rows in other files
            else:
                kind = "changes"
            files, counts = _publish(spark, lake, stream, snapshot, kind) if kind != "none" else ([], {})
            crash_point(faults.SOURCE_AFTER_EMIT)
            cursor = SourceCursor(snapshot.snapshot_id, snapshot.sequence_number)
            _write_cursor(lake.paths, stream, cursor)
            shutil.rmtree(lake.paths.staging(stream.name) / "source", ignore_errors=True)
            emitted.append(EmittedSnapshot(snapshot.snapshot_id, kind, counts, files))
        return emitted
