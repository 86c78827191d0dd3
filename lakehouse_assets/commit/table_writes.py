"""How rows reach a table from Spark, with ``lakehouse.*`` keys in the snapshot summary.

Appends pass the keys as ``snapshot-property.*`` write options. Rows a writer already wrote into
staged snapshots are published by Iceberg's ``AppendFiles`` (through py4j: PySpark has no API for
it), which adds those same data files to a branch with the keys and writes no data.

``MERGE INTO`` is SQL, which has no such option, so the statement runs with the keys in Iceberg's
``CommitMetadata`` thread-local, which Iceberg's Spark writer adds to the commit's summary
(:func:`run_with_commit_properties`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakehouse_assets.batches.staged_format import DELETE, OPERATION_COLUMN
from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.commit.recovery import MAIN_BRANCH
from lakehouse_assets.jvm.spark_jvm import jvm as spark_jvm

COMMIT_PROPERTIES_FIELD = "COMMIT_PROPERTIES"
"""The thread-local of Iceberg's ``CommitMetadata`` that its Spark writes read a commit's summary from."""


@dataclass(frozen=True)
class ChangeCounts:
    """Rows a change batch inserts, updates and deletes (deleting a missing key counts nothing), and the
    stale changes it skips: older, by the order column, than the row they would change."""

    inserted: int
    updated: int
    deleted: int
    stale: int = 0


def _not_stale(order_column: str | None, change: str = "s", row: str = "t") -> str:
    """SQL that holds when a change may apply to a row: no order column, either side's order is
    NULL, or the change is not older than the row (a tie applies: a redelivery is idempotent)."""
    if not order_column:
        return "true"
    change_order, row_order = f"{change}.`{order_column}`", f"{row}.`{order_column}`"
    return f"({row_order} IS NULL OR {change_order} IS NULL OR {change_order} >= {row_order})"


def append_rows(frame: DataFrame, identifier: str, properties: dict[str, str], branch: str | None = None) -> None:
    """Append ``frame`` to the table (or its ``branch``) in one commit carrying ``properties`` in its summary."""
    writer = frame.writeTo(qualified_name(identifier, branch))
    for key, value in properties.items():
        writer = writer.option(f"snapshot-property.{key}", value)
    writer.append()


def append_staged_snapshots(
    spark: SparkSession,
    identifier: str,
    snapshot_ids: list[int],
    properties: dict[str, str],
    branch: str | None = None,
) -> None:
    """Publish the data files the staged snapshots ``snapshot_ids`` added to the table (or its
    ``branch``) in one append commit carrying ``properties`` in its summary."""
    table = spark_jvm(spark).org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
        spark._jsparkSession, qualified_name(identifier)
    )
    table.refresh()
    append = table.newAppend()
    for snapshot_id in snapshot_ids:
        for data_file in table.snapshot(snapshot_id).addedDataFiles(table.io()):
            append.appendFile(data_file)
    for key, value in properties.items():
        append.set(key, value)
    if branch and branch != MAIN_BRANCH:
        append.toBranch(branch)
    append.commit()


def count_changes(
    spark: SparkSession,
    identifier: str,
    changes: DataFrame,
    keys: list[str],
    branch: str | None = None,
    order_column: str | None = None,
) -> ChangeCounts:
    """What merging ``changes`` (one row per key, with its net operation) will do to the table (or
    its ``branch``), skipping changes older than their row by ``order_column``."""
    ordered = [order_column] if order_column else []
    existing = spark.table(qualified_name(identifier, branch)).select(*keys, *ordered)
    existing = existing.withColumn("_lakehouse_exists", F.lit(True)).alias("t")
    joined = changes.select(*keys, *ordered, OPERATION_COLUMN).alias("s").join(existing, on=keys, how="left")
    is_delete = F.col(OPERATION_COLUMN) == F.lit(DELETE)
    exists = F.col("_lakehouse_exists").isNotNull()
    applies = F.expr(_not_stale(order_column))
    [row] = joined.agg(
        F.count(F.when(~is_delete & ~exists, 1)).alias("inserted"),
        F.count(F.when(~is_delete & exists & applies, 1)).alias("updated"),
        F.count(F.when(is_delete & exists & applies, 1)).alias("deleted"),
        F.count(F.when(exists & ~applies, 1)).alias("stale"),
    ).collect()
    return ChangeCounts(row["inserted"], row["updated"], row["deleted"], row["stale"])


def run_with_commit_properties(spark: SparkSession, statement: str, properties: dict[str, str]) -> None:
    """Run one SQL statement whose Iceberg commit carries ``properties`` in its snapshot summary.

    Iceberg's way is ``CommitMetadata.withCommitProperties(properties, callable)``, which holds
    the properties in a thread-local while it calls the statement. From Python that callable is a
    py4j callback, which needs a callback server the JVM connects back to, one per JVM: a second
    process attached to the same JVM takes it over, and once that process is gone no commit of
    the first can call back. So this sets the thread-local itself, on this thread's JVM thread
    (PySpark pins each Python thread to one), runs the statement, and clears it, as the method does.
    """
    jvm = spark_jvm(spark)
    java_properties = jvm.java.util.HashMap()
    for key, value in properties.items():
        java_properties.put(key, value)
    holder = jvm.java.lang.Class.forName("org.apache.iceberg.spark.CommitMetadata").getDeclaredField(
        COMMIT_PROPERTIES_FIELD
    )
    holder.setAccessible(True)
    commit_properties = holder.get(None)
    commit_properties.set(java_properties)
    try:
        spark.sql(statement)
    finally:
        commit_properties.remove()


def merge_changes(
    spark: SparkSession,
    identifier: str,
    changes: DataFrame,
    keys: list[str],
    columns: list[str],
    properties: dict[str, str],
    view_name: str,
    branch: str | None = None,
    order_column: str | None = None,
) -> None:
    """Apply net changes (UPSERT or DELETE per key) to the table (or its ``branch``) in one MERGE
    commit carrying ``properties``; a change older than its row by ``order_column`` is skipped."""
    changes.createOrReplaceTempView(view_name)
    on = " AND ".join(f"t.`{key}` = s.`{key}`" for key in keys)
    assignments = ", ".join(f"t.`{column}` = s.`{column}`" for column in columns)
    names = ", ".join(f"`{column}`" for column in columns)
    values = ", ".join(f"s.`{column}`" for column in columns)
    applies = _not_stale(order_column)
    statement = (
        f"MERGE INTO {qualified_name(identifier, branch)} t USING {view_name} s ON {on} "
        f"WHEN MATCHED AND s.{OPERATION_COLUMN} = '{DELETE}' AND {applies} THEN DELETE "
        f"WHEN MATCHED AND s.{OPERATION_COLUMN} <> '{DELETE}' AND {applies} THEN UPDATE SET {assignments} "
        f"WHEN NOT MATCHED AND s.{OPERATION_COLUMN} <> '{DELETE}' THEN INSERT ({names}) VALUES ({values})"
    )
    try:
        run_with_commit_properties(spark, statement, properties)
    finally:
        spark.catalog.dropTempView(view_name)
