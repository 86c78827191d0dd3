"""Rows written into a table's data files without publishing them: Iceberg's write-audit-publish.

With ``write.wap.enabled`` on the table, a Spark write under ``spark.wap.id`` commits a *staged*
snapshot that no branch references; a later commit (an append, a row delta) adds its data files to
a branch. The writer stages append batches this way (``ingest/staging.py``) and the committer the
new rows of a change batch (``commit/row_deltas.py``).
"""

from __future__ import annotations

from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession

from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.errors import LakehouseError

WAP_ENABLED_PROPERTY = "write.wap.enabled"
WAP_ID_SETTING = "spark.wap.id"
WAP_ID_SUMMARY_KEY = "wap.id"


def allow_staged_snapshots(spark: SparkSession, table: Table, identifier: str) -> None:
    """Turn on ``write.wap.enabled`` where a table created before it lacks it (a metadata commit:
    the caller holds the table's lock)."""
    if table.properties.get(WAP_ENABLED_PROPERTY) != "true":
        spark.sql(f"ALTER TABLE {qualified_name(identifier)} SET TBLPROPERTIES ('{WAP_ENABLED_PROPERTY}' = 'true')")


def write_staged(rows: DataFrame, identifier: str, wap_id: str) -> None:
    """Write ``rows`` (the table's columns) into a staged snapshot named ``wap_id``: one file per
    table partition each task meets, no shuffle. The table allows staged snapshots."""
    session = rows.sparkSession
    session.conf.set(WAP_ID_SETTING, wap_id)
    try:
        rows.writeTo(qualified_name(identifier)).option("distribution-mode", "none").option(
            "fanout-enabled", "true"
        ).append()
    finally:
        session.conf.unset(WAP_ID_SETTING)


def staged_snapshot_id(table: Table | None, identifier: str, wap_id: str) -> int:
    """The id of the table's staged snapshot written with ``spark.wap.id = wap_id`` (newest first)."""
    for snapshot in reversed(table.snapshots() if table else []):
        if snapshot.summary and snapshot.summary.additional_properties.get(WAP_ID_SUMMARY_KEY) == wap_id:
            return snapshot.snapshot_id
    raise LakehouseError(f"table {identifier}: the staged snapshot {wap_id} is missing after its write")
