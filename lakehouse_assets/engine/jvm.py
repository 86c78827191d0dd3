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


ICEBERG_COMMIT_FAILED = "org.apache.iceberg.exceptions.CommitFailedException"
MAX_CAUSES = 20
"""Causes followed down a Java exception's chain (a chain could loop)."""


def is_commit_conflict(error: BaseException) -> bool:
    """Whether ``error`` is Iceberg's refusal of a commit because the table changed meanwhile (its
    ``CommitFailedException``, raised through py4j or within a Spark error): the Java exception
    and its causes are read by class, not by message."""
    # py4j's Py4JJavaError keeps the Java exception; PySpark's own exceptions keep it as _origin.
    thrown = getattr(error, "java_exception", None) or getattr(error, "_origin", None)
    seen = 0
    while thrown is not None and seen < MAX_CAUSES:
        if thrown.getClass().getName() == ICEBERG_COMMIT_FAILED:
            return True
        thrown, seen = thrown.getCause(), seen + 1
    return False
