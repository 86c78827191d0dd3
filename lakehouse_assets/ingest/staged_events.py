"""The rows a writer stages: what one pass keeps of a batch (the committer's side is
``batches.staged_rows``)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakehouse_assets.batches.staged_format import (
    EVENT_COLUMN,
    LINE_COLUMN,
    OPERATION_COLUMN,
    POSITION_COLUMN,
    REASON_COLUMN,
    SOURCE_FILE_COLUMN,
    UNCOERCIBLE_COLUMN,
)
from lakehouse_assets.ingest.change_events import collapse_changes
from lakehouse_assets.ingest.landing_reader import valid_text
from lakehouse_assets.jvm.column_cache import cached_columns


def staged_events(converted: DataFrame, table_schema: T.StructType, identifier_columns: list[str]) -> DataFrame:
    """What a writer stages in one pass: the converted columns and operation of every kept event,
    plus reason, original text, file and line for the rejected ones (NULL for good rows).

    With identifier columns, a key's changes are first collapsed to their net effect.
    """
    if identifier_columns:
        converted = collapse_changes(converted, identifier_columns, OPERATION_COLUMN, POSITION_COLUMN, REASON_COLUMN)
    return converted.select(*_staged_columns(table_schema))


@cached_columns
def _staged_columns(table_schema: T.StructType) -> list[Column]:
    """The columns :func:`staged_events` stages of each event."""
    accepted = F.col(REASON_COLUMN).isNull()
    return [
        *[F.col(f"`{field.name}`") for field in table_schema],
        F.col(OPERATION_COLUMN),
        F.col(REASON_COLUMN),
        F.col(UNCOERCIBLE_COLUMN),
        F.when(~accepted, valid_text(F.col(EVENT_COLUMN))).alias(EVENT_COLUMN),
        *[F.when(~accepted, F.col(name)).alias(name) for name in (SOURCE_FILE_COLUMN, LINE_COLUMN)],
    ]
