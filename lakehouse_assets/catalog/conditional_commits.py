"""Table metadata changes written only onto the metadata version they were decided from.

``ALTER TABLE ... SET TBLPROPERTIES`` and the ``fast_forward`` procedure re-read the table right
before they commit and apply the change to whatever they find, so a change decided from an older
version lands on what another host did meanwhile. These go one level under Spark SQL, to Iceberg's
``TableOperations.commit(base, metadata)``, which refuses a base that is no longer current: the
JDBC, Hive and Glue catalogs swap the metadata location only if it is still the base's. A REST
catalog checks only what the change touches (a property: the table's UUID; a branch: that branch's
head), so there the check against the version read remains a window. The Hadoop catalog renames
the next version into place; it fences only under the table's OS lock, which its callers hold.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.jvm.spark_jvm import is_commit_conflict
from lakehouse_assets.jvm.spark_jvm import jvm as spark_jvm

if TYPE_CHECKING:  # the DuckDB checks import the branches module, which imports this, without Spark
    from py4j.java_gateway import JavaObject
    from pyspark.sql import SparkSession

FILE_SCHEMES = ("file://", "file:")


def same_location(location: str, other: str) -> bool:
    """Whether two spellings of a metadata location (``/x``, ``file:/x``, ``file:///x``) name one file."""

    def local(spelling: str) -> str:
        return next((spelling[len(s) :] for s in FILE_SCHEMES if spelling.startswith(s)), spelling)

    first, second = local(location), local(other)
    if first.startswith("/") and second.startswith("/"):
        return PurePosixPath(first) == PurePosixPath(second)
    return location == other


def _commit_if_unchanged(
    spark: SparkSession, identifier: str, decided_from: str, change: Callable[[JavaObject], JavaObject]
) -> bool:
    """Commit ``change`` (a TableMetadata.Builder -> the same builder, changed) on the table's
    metadata only while it is still ``decided_from``; False, with nothing committed, otherwise (a
    catalog may leave the unreferenced metadata file it wrote before its swap failed)."""
    jvm = spark_jvm(spark)
    table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, qualified_name(identifier))
    operations = table.operations()
    base = operations.current()
    if not same_location(base.metadataFileLocation(), decided_from):
        return False
    try:
        operations.commit(base, change(jvm.org.apache.iceberg.TableMetadata.buildFrom(base)).build())
    except Exception as error:  # noqa: BLE001 - py4j wraps Iceberg's CommitFailedException
        if is_commit_conflict(error):
            return False
        raise
    spark.catalog.refreshTable(qualified_name(identifier))
    return True


def set_property_if_unchanged(spark: SparkSession, identifier: str, decided_from: str, key: str, value: str) -> bool:
    """Set table property ``key`` only while the table's metadata is still ``decided_from`` (a
    metadata location); False, with nothing committed, when the table has moved on since."""
    properties = spark_jvm(spark).java.util.HashMap()
    properties.put(key, value)
    return _commit_if_unchanged(spark, identifier, decided_from, lambda builder: builder.setProperties(properties))


def set_branch_if_unchanged(
    spark: SparkSession, identifier: str, decided_from: str, branch: str, snapshot_id: int
) -> bool:
    """Point ``branch`` at ``snapshot_id`` (main: the table's current snapshot) only while the
    table's metadata is still ``decided_from``; False, with nothing committed, otherwise."""
    return _commit_if_unchanged(
        spark, identifier, decided_from, lambda builder: builder.setBranchSnapshot(snapshot_id, branch)
    )
