"""The rows the committer reads back from a staged batch: the rows it publishes to the table
and the events it sends to the dead letters (the writer's side is ``ingest.staged_events``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakehouse_assets.batches.staged_format import (
    EVENT_COLUMN,
    LINE_COLUMN,
    OPERATION_COLUMN,
    REASON_COLUMN,
    SOURCE_FILE_COLUMN,
)
from lakehouse_assets.jvm.column_cache import Named, cached_columns, named

# The key under which Spark records the schema of the rows it wrote in each Parquet file's footer
# (``ParquetWriteSupport.SPARK_ROW_SCHEMA``): Spark's own read restores its types from it.
SPARK_ROW_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"


def read_staged(spark: SparkSession, directory: Path) -> DataFrame:
    """The rows Spark wrote to ``directory`` (a staged batch's events), read with the schema Spark
    recorded in their files. Spark reads the same schema without it, but infers it with a Spark job
    that reads a footer: 4 of the 12 jobs of a warm round of two streams (``docs/benchmarks.md``)."""
    schema = _written_schema(directory)
    reader = spark.read if schema is None else spark.read.schema(schema)
    return reader.parquet(str(directory))


def _written_schema(directory: Path) -> T.StructType | None:
    """The schema Spark recorded in the first data file under ``directory``; None without one."""
    first = min(directory.glob("part-*.parquet"), default=None)
    footer = pq.read_schema(first).metadata if first is not None else None
    if not footer or SPARK_ROW_SCHEMA_KEY not in footer:
        return None
    return T.StructType.fromJson(json.loads(footer[SPARK_ROW_SCHEMA_KEY]))


def accepted_rows(
    staged: DataFrame, table_schema: T.StructType, staged_names: Mapping[str, str | None] | None = None
) -> DataFrame:
    """The staged rows to publish, with their operation, as the table's columns: cast to the
    table's types (a column added by another batch first keeps its type) and NULL where the
    batch has no such column or struct field. ``staged_names`` maps a column's or struct field's
    dotted path to the name the batch staged it under, where that changed (None: not staged)."""
    accepted, columns = _accepted_columns(staged.schema, table_schema, dict(staged_names or {}))
    return staged.where(accepted).select(*named(columns))


@cached_columns
def _accepted_columns(
    staged_schema: T.StructType, table_schema: T.StructType, staged_names: dict[str, str | None]
) -> tuple[Column, Named]:
    """Which staged rows are accepted, and their columns as :func:`accepted_rows` selects them."""
    columns = [
        (field.name, _aligned(_top_level, staged_schema, field, field.name, staged_names)) for field in table_schema
    ]
    return F.col(REASON_COLUMN).isNull(), (*columns, (OPERATION_COLUMN, F.col(OPERATION_COLUMN)))


def _top_level(name: str) -> Column:
    return F.col(f"`{name}`")


def _aligned(
    member: Callable[[str], Column],
    staged_struct: T.StructType,
    field: T.StructField,
    path: str,
    staged_names: Mapping[str, str | None],
) -> Column:
    """The table's ``field`` (at ``path``) as its type, from the member of the staged struct
    (``member`` gives it by name) that holds it: by its staged name, so a struct staged before a
    field was added gets NULL in it."""
    name = staged_names.get(path, field.name)
    staged_type = next((staged.dataType for staged in staged_struct if staged.name == name), None)
    if name is None or staged_type is None:
        return F.lit(None).cast(field.dataType)
    return _as_table_type(member(name), staged_type, field.dataType, path, staged_names)


def _as_table_type(
    column: Column, staged_type: T.DataType, table_type: T.DataType, path: str, staged_names: Mapping[str, str | None]
) -> Column:
    """A staged value of ``staged_type`` as the table's ``table_type``: each struct's fields by
    their staged names (through lists' elements and maps' values too), the rest cast."""
    if isinstance(table_type, T.StructType) and isinstance(staged_type, T.StructType):
        fields = [
            _aligned(column.getField, staged_type, inner, f"{path}.{inner.name}", staged_names).alias(inner.name)
            for inner in table_type
        ]
        return F.when(column.isNotNull(), F.struct(*fields))
    if isinstance(table_type, T.ArrayType) and isinstance(staged_type, T.ArrayType) and _has_struct(table_type):
        element_type, staged_element, element_path = table_type.elementType, staged_type.elementType, f"{path}.element"
        return F.transform(
            column, lambda element: _as_table_type(element, staged_element, element_type, element_path, staged_names)
        )
    if isinstance(table_type, T.MapType) and isinstance(staged_type, T.MapType) and _has_struct(table_type):
        value_type, staged_value, value_path = table_type.valueType, staged_type.valueType, f"{path}.value"
        values = F.transform_values(
            column, lambda _, value: _as_table_type(value, staged_value, value_type, value_path, staged_names)
        )
        return values.cast(table_type)  # the keys
    return column.cast(table_type)


def _has_struct(data_type: T.DataType) -> bool:
    """Whether a struct is in ``data_type`` (a list's or map's without one is cast whole)."""
    if isinstance(data_type, T.ArrayType):
        return _has_struct(data_type.elementType)
    if isinstance(data_type, T.MapType):
        return _has_struct(data_type.valueType)
    return isinstance(data_type, T.StructType)


def rejected_events(staged: DataFrame) -> DataFrame:
    """The staged events that go to the dead letters: original text, reason, file and line."""
    rejected, columns = _rejected_columns()
    return staged.where(rejected).select(*named(columns))


@cached_columns
def _rejected_columns() -> tuple[Column, Named]:
    """Which staged rows are rejected, and their columns as :func:`rejected_events` selects them."""
    return F.col(REASON_COLUMN).isNotNull(), (
        ("event", F.col(EVENT_COLUMN)),
        ("reason", F.col(REASON_COLUMN)),
        ("source_file", F.col(SOURCE_FILE_COLUMN)),
        ("source_line", F.col(LINE_COLUMN).cast("long")),
    )
