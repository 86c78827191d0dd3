"""Small DataFrames of Python values, made on the JVM without a Python worker.

PySpark's ``createDataFrame`` of a local list sends the rows through a Python worker, a process
Spark starts beside its JVM with the ``python3`` on the PATH, not necessarily the driver's Python.
The pipeline needs no other: here the rows travel as one JSON text in the query, which the JVM
parses (``from_json``) and unpacks (``inline``), so no step depends on that Python.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F


def rows_frame(spark: SparkSession, rows: Sequence[Mapping[str, object]], schema: str) -> DataFrame:
    """A DataFrame with the columns of ``schema`` (Spark's DDL: ``"a string, `b` bigint"``) holding
    ``rows``, each a mapping of column names to values JSON can hold (a column a row lacks is null).
    A value that does not fit its column fails the query (``FAILFAST``) instead of turning the
    whole array to null, as Spark's default would, which would lose every row silently."""
    rows_json = json.dumps(list(rows))
    array = F.from_json(F.lit(rows_json), f"array<struct<{schema}>>", {"mode": "FAILFAST"})
    return spark.range(1).select(F.inline(array))
