"""The JVM behind a Spark session, for the Iceberg Java APIs PySpark does not wrap."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lakehouse_assets.errors import CommitConflictError

if TYPE_CHECKING:  # importing this module loads no PySpark (the DuckDB checks import it without one)
    from pyspark.sql import SparkSession


def copied_session(spark: SparkSession) -> SparkSession:
    """A copy of ``spark`` (its settings, catalogs, views and functions) whose own settings no
    other thread sees. PySpark has no public way to copy a session: ``newSession`` would drop the
    runtime settings (catalogs among them), so this goes around it to the JVM's ``cloneSession``
    (internal to Spark's SQL package, reachable through py4j)."""
    from pyspark.sql import SparkSession

    return SparkSession(spark.sparkContext, spark._jsparkSession.cloneSession())


def jvm(spark: SparkSession) -> Any:
    """The session's py4j view of its JVM (PySpark types it optional; a live session has one)."""
    view = spark._jvm
    if view is None:
        raise RuntimeError("the Spark session has no JVM: it was stopped")
    return view


# The names PySpark and this package look up on the JVM view again and again: ``functions`` for
# each column function (``F.col``, ``F.when``), ``PythonUtils`` for each list handed to the JVM,
# ``SparkSession`` and ``SparkSession$`` for the active session, ``py4j.reflection.TypeUtil``
# twelve times for each Java exception PySpark converts, and the packages of the Iceberg and Java
# classes named by their full names. py4j resolves a name anew each time (``JVMView`` and
# ``JavaPackage`` keep nothing) by a call to the JVM, and a package's name is tried as a class
# first: a miss that searches every jar on the class path, about 0.8 ms on 2 cores. What a name
# resolves to never changes for the view's JVM (a process has one gateway for life), so each
# name on these paths is resolved once and kept on its parent: a warm pipeline round takes about
# 8 % less CPU (``docs/benchmarks.md``).
RESOLVED_ONCE = (
    "functions",
    "PythonUtils",
    "SparkSession",
    "SparkSession$",
    "py4j.reflection.TypeUtil",
    "org.apache.iceberg.spark.Spark3Util",
    "org.apache.iceberg.parquet",
    "org.apache.iceberg.expressions",
    "org.apache.spark.sql.expressions",
    "org.apache.spark.util",
    "java.util",
    "java.lang",
)


def resolve_names_once(view: Any) -> None:
    """Keep the classes and packages on ``RESOLVED_ONCE``'s paths, each on its parent (the py4j
    JVM view ``view`` or a package): an attribute found on an object is not looked up in the JVM."""
    for path in RESOLVED_ONCE:
        parent = view
        for name in path.split("."):
            if name not in vars(parent):
                setattr(parent, name, getattr(parent, name))
            parent = vars(parent)[name]


ICEBERG_COMMIT_FAILED = "org.apache.iceberg.exceptions.CommitFailedException"
ICEBERG_VALIDATION_FAILED = "org.apache.iceberg.exceptions.ValidationException"
MAX_CAUSES = 20
"""Causes followed down a Java exception's chain (a chain could loop)."""


def is_commit_conflict(error: BaseException) -> bool:
    """Whether ``error`` is Iceberg's refusal of a commit because the table changed meanwhile (its
    ``CommitFailedException``, raised through py4j or within a Spark error, or a
    ``CommitConflictError`` a write raised for one): the Java exception and its causes are read by
    class, not by message."""
    return isinstance(error, CommitConflictError) or _thrown_as(error, ICEBERG_COMMIT_FAILED)


def is_validation_failure(error: BaseException) -> bool:
    """Whether ``error`` is Iceberg's ``ValidationException``: a commit's checks of what changed
    since its base snapshot (files it deletes from removed, conflicting files added) failed."""
    return _thrown_as(error, ICEBERG_VALIDATION_FAILED)


def _thrown_as(error: BaseException, class_name: str) -> bool:
    """Whether the Java exception behind ``error``, or one of its causes, is of class ``class_name``."""
    # py4j's Py4JJavaError keeps the Java exception; PySpark's own exceptions keep it as _origin.
    thrown = getattr(error, "java_exception", None) or getattr(error, "_origin", None)
    seen = 0
    while thrown is not None and seen < MAX_CAUSES:
        if thrown.getClass().getName() == class_name:
            return True
        thrown, seen = thrown.getCause(), seen + 1
    return False
