"""The dead-letter table next to each table: rejected events with the reason and where they came from."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakehouse_assets.batch_ledger import BatchRecord
from lakehouse_assets.conversion import rejected_events
from lakehouse_assets.tables import MANAGED_TABLE_PROPERTIES, qualified_name

DEAD_LETTER_SUFFIX = "_dead_letters"


def dead_letter_identifier(table_identifier: str) -> str:
    """The dead-letter table that sits next to a table: ``<namespace>.<table>_dead_letters``."""
    return f"{table_identifier}{DEAD_LETTER_SUFFIX}"


def ensure_dead_letter_table(spark: SparkSession, identifier: str) -> None:
    """Create the dead-letter table if needed (format v2, Iceberg's own commit retry off)."""
    properties = ", ".join(f"'{k}' = '{v}'" for k, v in {"format-version": "2", **MANAGED_TABLE_PROPERTIES}.items())
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {qualified_name(identifier)} ("
        "event string, reason string, stream string, batch_sequence bigint, source_file string, "
        f"source_line bigint, recorded_at timestamp) USING iceberg TBLPROPERTIES ({properties})"
    )


def dead_letter_rows(spark: SparkSession, stream: str, batches: list[BatchRecord]) -> DataFrame:
    """The rejected events of staged batches, as rows of the dead-letter table."""
    frames = [
        rejected_events(spark.read.parquet(str(record.events_path()))).select(
            "event",
            "reason",
            F.lit(stream).alias("stream"),
            F.lit(record.sequence).cast("bigint").alias("batch_sequence"),
            "source_file",
            "source_line",
            F.current_timestamp().alias("recorded_at"),
        )
        for record in batches
    ]
    return reduce(DataFrame.unionByName, frames)
