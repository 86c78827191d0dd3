"""Convert raw NDJSON events to a table's schema in Spark, with the sink RFC's coercion rules.

Each event is parsed once with every table column read as text (``from_json`` keeps a number's or
an object's JSON text for a string field); each column is then coerced to its type:

========================  ==============================================================
table type                accepted event values
========================  ==============================================================
int, long                 integer numbers or digit strings; a fractional number is truncated
float, double, decimal    numbers or numeric strings
boolean                   ``true``/``false`` (JSON booleans or strings, any case)
string                    any value; objects and arrays keep their JSON text
timestamp, timestamptz    ISO 8601 strings or epoch milliseconds
date                      ISO 8601 dates or epoch days
binary                    Base64 strings
========================  ==============================================================

An event is rejected, with the reason, when it is not a JSON object, when none of its fields
match a column, or when a required column is missing or cannot be coerced; an optional column
that cannot be coerced is written as NULL. Extra fields are ignored.
"""

from __future__ import annotations

import operator
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

EVENT_COLUMN = "_lakehouse_event"
SOURCE_FILE_COLUMN = "_lakehouse_source_file"
REASON_COLUMN = "_lakehouse_reason"
_RAW = "_lakehouse_raw"
INTEGER_TEXT = r"^\s*-?\d+\s*$"


def _coerce(raw: Column, data_type: T.DataType) -> Column:
    trimmed = F.trim(raw)
    if isinstance(data_type, (T.IntegerType, T.LongType, T.ShortType, T.ByteType)):
        return F.when(raw.rlike(INTEGER_TEXT), trimmed.cast(data_type)).otherwise(
            trimmed.cast("double").cast(data_type)
        )
    if isinstance(data_type, T.BooleanType):
        lowered = F.lower(trimmed)
        return F.when(lowered.isin("true", "false"), lowered == F.lit("true"))
    if isinstance(data_type, T.StringType):
        return raw
    if isinstance(data_type, (T.TimestampType, T.TimestampNTZType)):
        from_millis = F.timestamp_millis(trimmed.cast("long")).cast(data_type)
        return F.when(raw.rlike(INTEGER_TEXT), from_millis).otherwise(trimmed.cast(data_type))
    if isinstance(data_type, T.DateType):
        from_days = F.date_add(F.lit("1970-01-01").cast("date"), trimmed.cast("int"))
        return F.when(raw.rlike(INTEGER_TEXT), from_days).otherwise(trimmed.cast("date"))
    if isinstance(data_type, T.BinaryType):
        return F.unbase64(trimmed)
    return trimmed.cast(data_type)


def _type_name(data_type: T.DataType) -> str:
    return data_type.simpleString()


def _rejection_reason(fields: list[T.StructField]) -> Column:
    """The first rule an event breaks, or NULL when it converts."""
    raw = {field.name: F.col(f"{_RAW}.`{field.name}`") for field in fields}
    rules: list[tuple[Column, Column]] = [
        (F.json_object_keys(F.col(EVENT_COLUMN)).isNull(), F.lit("not a JSON object")),
        (
            ~reduce(
                operator.or_,
                [value.isNotNull() for value in raw.values()],
                F.lit(False),
            ),
            F.lit("no field matches the table schema"),
        ),
    ]
    for field in fields:
        if field.nullable:
            continue
        value = raw[field.name]
        rules.append((value.isNull(), F.lit(f"missing required field '{field.name}'")))
        rules.append(
            (
                F.col(field.name).isNull(),
                F.concat(
                    F.lit(f"required field '{field.name}': "),
                    value,
                    F.lit(f" is not a {_type_name(field.dataType)}"),
                ),
            )
        )
    reason = F.lit(None).cast("string")
    for condition, message in reversed(rules):
        reason = F.when(condition, message).otherwise(reason)
    return reason


def convert_events(lines: DataFrame, table_schema: T.StructType) -> DataFrame:
    """Converted columns plus ``_reason`` (NULL for good rows), ``_event`` and ``_source_file``.

    ``lines`` has one row per NDJSON line in column ``value`` (``spark.read.text``).
    """
    text_schema = T.StructType([T.StructField(field.name, T.StringType()) for field in table_schema])
    parsed = (
        lines.where(F.trim(F.col("value")) != "")
        .select(
            F.col("value").alias(EVENT_COLUMN),
            F.element_at(F.split(F.input_file_name(), "/"), -1).alias(SOURCE_FILE_COLUMN),
        )
        .withColumn(_RAW, F.from_json(F.col(EVENT_COLUMN), text_schema))
    )
    converted = parsed.select(
        EVENT_COLUMN,
        SOURCE_FILE_COLUMN,
        _RAW,
        *[_coerce(F.col(f"{_RAW}.`{field.name}`"), field.dataType).alias(field.name) for field in table_schema],
    )
    return converted.withColumn(REASON_COLUMN, _rejection_reason(list(table_schema))).drop(_RAW)


def staged_events(converted: DataFrame, table_schema: T.StructType) -> DataFrame:
    """What a writer stages in one pass: the converted columns for every event, plus reason,
    original text and source file for the rejected ones (NULL for good rows, so they cost nothing)."""
    rejected = F.col(REASON_COLUMN).isNotNull()
    return converted.select(
        *[F.col(f"`{field.name}`") for field in table_schema],
        F.col(REASON_COLUMN),
        F.when(rejected, F.col(EVENT_COLUMN)).alias(EVENT_COLUMN),
        F.when(rejected, F.col(SOURCE_FILE_COLUMN)).alias(SOURCE_FILE_COLUMN),
    )


def accepted_rows(staged: DataFrame, columns: list[str]) -> DataFrame:
    """The staged rows to publish, in the table's column order."""
    return staged.where(F.col(REASON_COLUMN).isNull()).select(*[F.col(f"`{name}`") for name in columns])


def rejected_events(staged: DataFrame) -> DataFrame:
    """The staged events that go to the dead letters: original text, reason and source file."""
    return staged.where(F.col(REASON_COLUMN).isNotNull()).select(
        F.col(EVENT_COLUMN).alias("event"),
        F.col(REASON_COLUMN).alias("reason"),
        F.col(SOURCE_FILE_COLUMN).alias("source_file"),
    )
