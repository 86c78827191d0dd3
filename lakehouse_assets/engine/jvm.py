"""The JVM behind a Spark session, for the Iceberg Java APIs PySpark does not wrap."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing this module loads no PySpark (the DuckDB checks import it without one)
    from pyspark.sql import SparkSession


def jvm(spark: SparkSession) -> Any:
    """The session's py4j view of its JVM (PySpark types it optional; a live session has one)."""
    view = spark._jvm
    if view is None:
        raise RuntimeError("the Spark session has no JVM: it was stopped")
    return view
