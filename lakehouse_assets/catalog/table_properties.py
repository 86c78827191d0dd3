"""A table property written only onto the metadata version it was decided from.

``ALTER TABLE ... SET TBLPROPERTIES`` re-reads the table right before it commits and sets the value
on whatever it finds, so a value computed from an older version overwrites what another host set
meanwhile. This goes one level under Spark SQL, to Iceberg's ``TableOperations.commit(base,
metadata)``, whose contract is to refuse a base that is no longer current: the catalog's
compare-and-swap (JDBC, REST, ...) or the Hadoop catalog's atomic rename decides.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import urlparse

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from lakehouse_assets.catalog.table_metadata import qualified_name


def _same_file(location: str, other: str) -> bool:
    """Whether two spellings of a metadata location (``/x``, ``file:/x``, ``file:///x``) name one file."""
    first, second = urlparse(location), urlparse(other)
    if {first.scheme, second.scheme} <= {"", "file"}:
        return PurePosixPath(first.path) == PurePosixPath(second.path)
    return location == other


def set_property_if_unchanged(spark: SparkSession, identifier: str, decided_from: str, key: str, value: str) -> bool:
    """Set table property ``key`` only while the table's metadata is still ``decided_from`` (a
    metadata location); False, with nothing written, when the table has moved on since."""
    jvm = spark._jvm
    table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, qualified_name(identifier))
    operations = table.operations()
    base = operations.current()
    if not _same_file(base.metadataFileLocation(), decided_from):
        return False
    properties = jvm.java.util.HashMap()
    properties.put(key, value)
    updated = jvm.org.apache.iceberg.TableMetadata.buildFrom(base).setProperties(properties).build()
    try:
        operations.commit(base, updated)
    except Py4JJavaError as error:
        if "CommitFailedException" in str(error.java_exception):
            return False
        raise
    return True
