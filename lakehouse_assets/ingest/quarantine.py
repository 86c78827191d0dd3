"""The events a Spark job cannot convert: found by converting halves, then dead-lettered.

Conversion is total by design: every value becomes a column value, NULL, or a dead letter with a
reason. This is the safety net for what it still misses. When the writer's Spark job fails, the
batch's lines are converted again, into Spark's no-op sink, a span of lines at a time: a span that
fails is halved until single lines remain. Those lines become dead letters with Spark's error and
the rest of the batch is staged, so a stream is never stalled by its own data. A failure that no
span reproduces (a lost executor, a full disk) is not the data's, and is raised as it was.

Cost: about two conversions of the batch per failing line and halving (a 1M-line batch with one
bad line: about 40 passes over the cached lines); paid only when a batch fails.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakehouse_assets.batches.staged_format import (
    EVENT_COLUMN,
    LINE_COLUMN,
    OPERATION_COLUMN,
    REASON_COLUMN,
    SOURCE_FILE_COLUMN,
    UNCOERCIBLE_COLUMN,
)
from lakehouse_assets.engine.local_rows import rows_frame
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.ingest.landing_reader import valid_text

SPARK_ERRORS = (Py4JJavaError, PySparkException)
"""What a failed Spark job raises in PySpark."""
MAX_FAILING_LINES = 100
"""More failing lines than this is not a few hostile events: the batch fails as it did."""
MAX_REASON_CHARACTERS = 500
JAVA_EXCEPTION = re.compile(r"\b(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error)\b")


@dataclass(frozen=True)
class FailingLine:
    """A landing line whose conversion fails a Spark job, and Spark's error."""

    source_file: str
    line: int
    error: str

    @property
    def reason(self) -> str:
        return f"Spark could not convert this event: {self.error}"


def describe_spark_error(error: Exception) -> str:
    """What failed a Spark job, e.g. ``java.lang.ArithmeticException: long overflow``: the last
    Java exception named on the first line of its message (a failed task's cause), else that line."""
    text = str(error.java_exception) if isinstance(error, Py4JJavaError) else str(error)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    causes = list(JAVA_EXCEPTION.finditer(first))
    return (first[causes[-1].start() :] if causes else first)[:MAX_REASON_CHARACTERS]


def isolate_failing_lines(lines: DataFrame, converts: Callable[[DataFrame], None]) -> list[FailingLine]:
    """The lines of ``lines`` (from ``read_landing_lines``) on which ``converts`` fails a Spark job,
    found by halving spans of each file's lines. Raises LakehouseError past MAX_FAILING_LINES."""
    lines = lines.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        spans = lines.groupBy(SOURCE_FILE_COLUMN).agg(F.min(LINE_COLUMN), F.max(LINE_COLUMN)).collect()
        pending = sorted(((file, first, last) for file, first, last in spans), reverse=True)
        failing: list[FailingLine] = []
        while pending:
            file, first, last = pending.pop()
            span = lines.where((F.col(SOURCE_FILE_COLUMN) == file) & F.col(LINE_COLUMN).between(first, last))
            try:
                converts(span)
                continue
            except SPARK_ERRORS as error:
                if first == last:
                    failing.append(FailingLine(file, first, describe_spark_error(error)))
                    if len(failing) > MAX_FAILING_LINES:
                        raise LakehouseError(
                            f"more than {MAX_FAILING_LINES} events fail Spark's conversion (e.g. {file} line "
                            f"{first}: {failing[-1].error}); the batch is not staged"
                        ) from error
                    continue
            middle = (first + last) // 2
            pending += [(file, middle + 1, last), (file, first, middle)]
        return failing
    finally:
        lines.unpersist()


def _failing_frame(lines: DataFrame, failing: list[FailingLine]) -> DataFrame:
    schema = f"`{SOURCE_FILE_COLUMN}` string, `{LINE_COLUMN}` long, `{REASON_COLUMN}` string"
    rows = [
        {SOURCE_FILE_COLUMN: found.source_file, LINE_COLUMN: found.line, REASON_COLUMN: found.reason}
        for found in failing
    ]
    return F.broadcast(rows_frame(lines.sparkSession, rows, schema))


def without_failing(lines: DataFrame, failing: list[FailingLine]) -> DataFrame:
    """``lines`` less the failing ones."""
    return lines.join(_failing_frame(lines, failing), [SOURCE_FILE_COLUMN, LINE_COLUMN], "left_anti")


def quarantined_events(lines: DataFrame, failing: list[FailingLine], table_schema: T.StructType) -> DataFrame:
    """The failing lines as staged rejected events (no column values, the reason, text, file and
    line), to union with the staged events of the others."""
    found = lines.join(_failing_frame(lines, failing), [SOURCE_FILE_COLUMN, LINE_COLUMN])
    return found.select(
        *[F.lit(None).cast(field.dataType).alias(field.name) for field in table_schema],
        F.lit(None).cast("string").alias(OPERATION_COLUMN),
        REASON_COLUMN,
        F.array().cast("array<string>").alias(UNCOERCIBLE_COLUMN),
        valid_text(F.col(EVENT_COLUMN)).alias(EVENT_COLUMN),
        SOURCE_FILE_COLUMN,
        LINE_COLUMN,
    )
