"""The rows a writer stages: what one pass keeps of a batch (the committer's side is
``batches.staged_rows``)."""

from __future__ import annotations

from pyspark.sql import DataFrame
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
from lakehouse_assets.jvm.column_cache import Named, cached_columns, named


def staged_events(converted: DataFrame, table_schema: T.StructType, identifier_columns: list[str]) -> DataFrame:
    """What a writer stages in one pass: the converted columns and operation of every kept event,
    plus reason, original text, file and line for the rejected ones (NULL for good rows).

    With identifier columns, a key's changes are first collapsed to their net effect.
    """
    if identifier_columns:
        converted = collapse_changes(converted, identifier_columns, OPERATION_COLUMN, POSITION_COLUMN, REASON_COLUMN)
    return converted.select(*named(_staged_columns(table_schema)))


@cached_columns
def _staged_columns(table_schema: T.StructType) -> Named:
    """The columns :func:`staged_events` stages of each event."""
    accepted = F.col(REASON_COLUMN).isNull()
    kept = [field.name for field in table_schema] + [OPERATION_COLUMN, REASON_COLUMN, UNCOERCIBLE_COLUMN]
    return (
        *[(name, F.col(f"`{name}`")) for name in kept],
        (EVENT_COLUMN, F.when(~accepted, valid_text(F.col(EVENT_COLUMN)))),
        *[(name, F.when(~accepted, F.col(name))) for name in (SOURCE_FILE_COLUMN, LINE_COLUMN)],
    )
