"""Convert raw NDJSON events to a table's schema in Spark, with the sink RFC's coercion rules.

Each event is parsed with every table column read as text (``from_json`` keeps a number's or an
object's JSON text for a string field); each column is then coerced to its type. Columns whose JSON
numbers or booleans Spark's parser reads exactly as the coercion would (integers, doubles,
booleans) are parsed typed first, which skips most of the text path's cost: an event whose typed
parse fails anywhere (a digit string for a long, a fraction for an int, a number out of range) is
parsed again as text, so both paths give the same rows and reasons. The typed parse of a plain
append's events may come from Spark's JSON file reader instead (``parsed_lines``,
:func:`convert_parsed_events`), with the same result.

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
fixed[N]                  Base64 strings of exactly N bytes
uuid                      UUID strings (any case; stored lower case)
struct                    objects; each field converted recursively, missing or
                          uncoercible fields NULL
list                      arrays; each element converted recursively
map                       objects; keys and values converted recursively
========================  ==============================================================

An event is rejected, with the reason, when it is not a JSON object, when its operation is not
recognized, when none of its fields match a column, when a required column is missing or cannot
be coerced (for a DELETE only the identifier columns must be present), or when its row does not
meet an expectation with ``on_failure: dead_letter``; an optional column that cannot be coerced is
written as NULL, and named in the event's ``_lakehouse_uncoercible`` (the batch counts them per
column; below a column by its path: ``point.x``, ``tags.element``, ``scores.key``, ``scores.value``).
Extra fields are ignored.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce
from typing import cast

from pyiceberg.schema import Schema
from pyiceberg.types import FixedType, IcebergType, StructType, UUIDType
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakehouse_assets.batches.staged_format import (
    DELETE,
    EVENT_COLUMN,
    LINE_COLUMN,
    OPERATION_COLUMN,
    POSITION_COLUMN,
    REASON_COLUMN,
    SOURCE_FILE_COLUMN,
    UNCOERCIBLE_COLUMN,
)
from lakehouse_assets.config.spec import SOURCE_POSITION_COLUMN, StreamSpec
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.ingest.change_events import event_shape
from lakehouse_assets.ingest.landing_reader import BATCH_COLUMN, BYTE_ORDER_MARK
from lakehouse_assets.jvm.column_cache import Named, cached_columns, named

ICEBERG_TYPE = "iceberg_type"
UUID_TEXT = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\z"
_ROW = "_lakehouse_row"
_RAW_OPERATION = "_lakehouse_raw_operation"
_RAW = "_lakehouse_raw"
_TYPED = "_lakehouse_typed"
CORRUPT_COLUMN = "_lakehouse_corrupt"
"""Set in the typed parse of an event that failed anywhere (Spark's ``columnNameOfCorruptRecord``)."""
PARSE_OPTIONS = {"columnNameOfCorruptRecord": CORRUPT_COLUMN}
# Types whose value from Spark's typed JSON parse, when it succeeds, is what ``coerce_text`` makes of
# the value's text (a JSON number or boolean of the type; anything else fails the typed parse).
# Not float or decimal: their typed parse rounds differently from a cast of the text.
TYPED_PARSE_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DoubleType, T.BooleanType)
# Java regular expressions for ``rlike``: ``\z`` is the very end (``$`` also matches before a final
# line break).
INTEGER_TEXT = r"^\s*-?\d+\s*\z"
# How a JSON parse as text writes the non-numeric numbers Spark's parser accepts (Java's names).
NON_NUMERIC_NUMBERS = ("NaN", "Infinity", "-Infinity")
# What Spark's timestamps and dates hold and Iceberg, Parquet and DuckDB read back: 0001-01-01 to
# 9999-12-31 (UTC). An epoch number outside it (seconds, microseconds or nanoseconds taken for
# milliseconds) cannot be coerced instead of overflowing the conversion.
MIN_EPOCH_MILLIS, MAX_EPOCH_MILLIS = -62_135_596_800_000, 253_402_300_799_999
MIN_EPOCH_DAYS, MAX_EPOCH_DAYS = -719_162, 2_932_896
INTEGER_BITS: dict[type[T.DataType], int] = {T.ByteType: 8, T.ShortType: 16, T.IntegerType: 32, T.LongType: 64}
BASE64_TEXT = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?\z"


_TEXT_FIELDS = T.MapType(T.StringType(), T.StringType())
_TEXT_ELEMENTS = T.ArrayType(T.StringType())


def with_iceberg_types(spark_schema: T.StructType, iceberg_schema: Schema) -> T.StructType:
    """The table's Spark schema with the Iceberg type of its uuid and fixed[N] columns and struct
    fields in their metadata (Spark reads them as string and binary; their values are checked)."""

    def annotated(spark_type: T.DataType, iceberg_type: IcebergType | None) -> T.DataType:
        if not (isinstance(spark_type, T.StructType) and isinstance(iceberg_type, StructType)):
            return spark_type
        fields = []
        for field in spark_type.fields:
            member = next((f.field_type for f in iceberg_type.fields if f.name == field.name), None)
            metadata = {ICEBERG_TYPE: str(member)} if isinstance(member, (UUIDType, FixedType)) else field.metadata
            fields.append(T.StructField(field.name, annotated(field.dataType, member), field.nullable, metadata))
        return T.StructType(fields)

    return cast(T.StructType, annotated(spark_schema, iceberg_schema.as_struct()))


def _checked_text(raw: Column, iceberg_type: str) -> Column:
    """A uuid's canonical text, or a fixed[N]'s N bytes from Base64; NULL when the value is not one."""
    trimmed = F.trim(raw)
    if iceberg_type == "uuid":
        return F.when(trimmed.rlike(UUID_TEXT), F.lower(trimmed))
    decoded = _from_base64(trimmed)
    return F.when(F.length(decoded) == int(iceberg_type[len("fixed[") : -1]), decoded)


def _from_base64(text: Column) -> Column:
    """The bytes of Base64 text, NULL when it is not Base64 (Spark's decoder would fail the job on
    a last group of one character)."""
    return F.when(text.rlike(BASE64_TEXT), F.unbase64(text))


def coerce_text(raw: Column, data_type: T.DataType, iceberg_type: str | None = None) -> Column:
    """``raw`` (a JSON value's text) as ``data_type`` (``iceberg_type`` for uuid and fixed[N]), or
    NULL when it cannot be coerced."""
    if iceberg_type:
        return _checked_text(raw, iceberg_type)
    if isinstance(data_type, T.StructType):
        # Each field from the object's member of the same name, coerced recursively.
        members = F.from_json(raw, _TEXT_FIELDS)  # type: ignore[arg-type]  # a map schema; the stubs omit it
        fields = [
            coerce_text(members.getItem(field.name), field.dataType, field.metadata.get(ICEBERG_TYPE)).alias(field.name)
            for field in data_type
        ]
        return F.when(members.isNotNull(), F.struct(*fields))
    if isinstance(data_type, T.ArrayType):
        return F.transform(
            F.from_json(raw, _TEXT_ELEMENTS), lambda element: coerce_text(element, data_type.elementType)
        )
    if isinstance(data_type, T.MapType):
        # A key that cannot be coerced drops its entry (a map key cannot be NULL); keys that
        # coerce alike keep the last value (spark.sql.mapKeyDedupPolicy, spark.py).
        members = F.map_filter(
            F.from_json(raw, _TEXT_FIELDS),  # type: ignore[arg-type]  # a map schema; the stubs omit it
            lambda key, _: coerce_text(key, data_type.keyType).isNotNull(),
        )
        coerced = F.transform_values(members, lambda _, value: coerce_text(value, data_type.valueType))
        return F.transform_keys(coerced, lambda key, _: coerce_text(key, data_type.keyType))
    trimmed = F.trim(raw)
    if type(data_type) in INTEGER_BITS:
        # Integer text exactly (a fraction is truncated; out of range is NULL); other numbers through
        # a double, NULL when NaN, infinite or out of range (a cast would clamp them to a wrong value).
        limit = float(2 ** (INTEGER_BITS[type(data_type)] - 1))
        number = trimmed.cast("double")
        from_number = F.when((number >= -limit) & (number < limit), number.cast(data_type))
        return F.when(raw.rlike(INTEGER_TEXT), trimmed.cast(data_type)).otherwise(from_number)
    if isinstance(data_type, T.BooleanType):
        lowered = F.lower(trimmed)
        return F.when(lowered.isin("true", "false"), lowered == F.lit("true"))
    if isinstance(data_type, T.StringType):
        return raw
    if isinstance(data_type, (T.FloatType, T.DoubleType)):
        # Spark's parser takes the bare tokens NaN, Infinity and -Infinity as numbers, as its typed
        # parse keeps them; parsed as text they come back quoted (Jackson writes a non-numeric
        # number as a string), so they lose their quotes before the cast.
        non_numeric = trimmed.isin(*[f'"{token}"' for token in NON_NUMERIC_NUMBERS])
        number = F.when(non_numeric, F.translate(trimmed, '"', "")).otherwise(trimmed)
        if isinstance(data_type, T.DoubleType):
            return number.cast(data_type)
        # A finite number beyond a float's range would be cast to infinity: NULL instead (schema
        # evolution promotes the column to double for it).
        return F.when(~float_overflows(number.cast("double")), number.cast(data_type))
    if isinstance(data_type, (T.TimestampType, T.TimestampNTZType)):
        millis = trimmed.cast("long")
        in_range = millis.between(MIN_EPOCH_MILLIS, MAX_EPOCH_MILLIS)
        from_millis = F.when(in_range, F.timestamp_millis(millis)).cast(data_type)
        # Integer text always casts to a long, but for more digits than a long holds (no timestamp
        # either): the cheap cast spares an ISO 8601 string the regular expression.
        integer = millis.isNotNull() & raw.rlike(INTEGER_TEXT)
        return F.when(integer, from_millis).otherwise(trimmed.cast(data_type))
    if isinstance(data_type, T.DateType):
        days = trimmed.cast("int")
        in_range = days.between(MIN_EPOCH_DAYS, MAX_EPOCH_DAYS)
        from_days = F.when(in_range, F.date_add(F.lit("1970-01-01").cast("date"), days))
        return F.when(raw.rlike(INTEGER_TEXT), from_days).otherwise(trimmed.cast("date"))
    if isinstance(data_type, T.BinaryType):
        return _from_base64(trimmed)
    return trimmed.cast(data_type)


def may_not_coerce(field: T.StructField) -> bool:
    """Whether an event's value for this column can be written as NULL because it did not coerce:
    an optional column that is not a string (any value is a string). Identifier columns are required."""
    return field.nullable and not isinstance(field.dataType, T.StringType)


def uncoercible_paths(fields: list[T.StructField]) -> list[str]:
    """What an event's ``_lakehouse_uncoercible`` can name: the columns :func:`may_not_coerce`
    and, below them, by path, each place a value can be lost for not coercing: a struct's field
    (``point.x``, at any depth), a list's element (``tags.element``), a map's key (an entry
    dropped) or value (``scores.key``, ``scores.value``), and the places below an element or a
    value (``items.element.qty``)."""
    paths = []
    for field in fields:
        if may_not_coerce(field):
            paths.append(field.name)
        paths += [f"{field.name}.{path}" for path in _paths_below(field.dataType)]
    return paths


def _paths_below(data_type: T.DataType) -> list[str]:
    if isinstance(data_type, T.StructType):
        return uncoercible_paths(data_type.fields)
    if isinstance(data_type, T.ArrayType):
        return _paths_of("element", data_type.elementType)
    if isinstance(data_type, T.MapType):
        return ["key"] * _may_lose(data_type.keyType) + _paths_of("value", data_type.valueType)
    return []


def _paths_of(name: str, data_type: T.DataType) -> list[str]:
    """A list's element or a map's value named ``name``: itself where it can be lost, and below it."""
    return [name] * _may_lose(data_type) + [f"{name}.{path}" for path in _paths_below(data_type)]


def _may_lose(data_type: T.DataType) -> bool:
    """Whether a list's element or a map's key or value of this type can fail to coerce (a string
    never does)."""
    return not isinstance(data_type, T.StringType)


def float_overflows(number: Column) -> Column:
    """Whether a double is finite and a float would make it infinity (beyond a float's range)."""
    infinity = F.lit(float("inf"))
    return (F.abs(number.cast("float")) == infinity) & (F.abs(number) != infinity)


def _type_name(field: T.StructField) -> str:
    return field.metadata.get(ICEBERG_TYPE) or field.dataType.simpleString()


def _first_failure(rules: list[tuple[Column, Column]]) -> Column:
    reason = F.lit(None).cast("string")
    for condition, message in reversed(rules):
        reason = F.when(condition, message).otherwise(reason)
    return reason


def _missing_or_uncoercible(field: T.StructField, label: str) -> list[tuple[Column, Column]]:
    return [
        (~_field_present(field), F.lit(f"missing {label} '{field.name}'")),
        (
            F.col(f"`{field.name}`").isNull(),
            F.concat(F.lit(f"{label} '{field.name}': "), _field_text(field), F.lit(f" is not a {_type_name(field)}")),
        ),
    ]


def _rejection_reason(fields: list[T.StructField], stream: StreamSpec, identifier_columns: list[str]) -> Column:
    """The first rule an event breaks, or NULL when it converts."""
    any_field = reduce(operator.or_, [_field_present(field) for field in fields], F.lit(False))
    is_delete = F.col(OPERATION_COLUMN) == F.lit(DELETE)
    rules: list[tuple[Column, Column]] = [
        (
            ~any_field & ~_typed_parse_succeeded() & F.json_object_keys(F.col(EVENT_COLUMN)).isNull(),
            F.lit("not a JSON object"),
        )
    ]
    if stream.applies_changes:
        rules.append(
            (
                F.col(OPERATION_COLUMN).isNull(),
                F.concat(F.lit("unrecognized operation '"), F.coalesce(F.col(_RAW_OPERATION), F.lit("")), F.lit("'")),
            )
        )
    if stream.is_debezium:
        rules.append(
            (
                F.json_object_keys(F.col(_ROW)).isNull(),
                F.when(is_delete, F.lit("Debezium delete without a 'before' row")).otherwise(
                    F.lit("Debezium change without an 'after' row")
                ),
            )
        )
    rules.append((~any_field, F.lit("no field matches the table schema")))
    by_name = {field.name: field for field in fields}
    for name in identifier_columns:
        rules.extend(_missing_or_uncoercible(by_name[name], "identifier column"))
    for field in fields:
        if not field.nullable and field.name not in identifier_columns:
            rules.extend(
                (~is_delete & condition, message)
                for condition, message in _missing_or_uncoercible(field, "required field")
            )
    for expectation in stream.expectations:
        if expectation.on_failure == "dead_letter":
            met = F.coalesce(F.expr(expectation.condition), F.lit(False))
            rules.append((~is_delete & ~met, F.lit(f"expectation {expectation.name} not met: {expectation.condition}")))
    return _first_failure(rules)


def row_fields(table_schema: T.StructType) -> list[T.StructField]:
    """The columns taken from an event's row (a Debezium table's source position comes from its
    envelope)."""
    return [field for field in table_schema if field.name != SOURCE_POSITION_COLUMN]


def typed_parse_schema(fields: list[T.StructField]) -> T.StructType:
    """What the typed parse of an event's row reads: ``TYPED_PARSE_TYPES`` typed, every other field
    as text, and ``CORRUPT_COLUMN``, set when the parse failed anywhere."""
    return T.StructType(
        [T.StructField(field.name, field.dataType if _parsed_typed(field) else T.StringType()) for field in fields]
        + [T.StructField(CORRUPT_COLUMN, T.StringType())]
    )


def convert_events(
    lines: DataFrame, table_schema: T.StructType, stream: StreamSpec, identifier_columns: list[str]
) -> DataFrame:
    """Converted columns plus operation, source position and ``_lakehouse_reason`` (NULL when good).

    ``lines`` comes from :func:`read_landing_lines`.
    """
    conversion = _conversion(table_schema, stream, identifier_columns, from_lines=True)
    parsed = lines.select(
        EVENT_COLUMN,
        SOURCE_FILE_COLUMN,
        LINE_COLUMN,
        *([BATCH_COLUMN] if BATCH_COLUMN in lines.columns else []),
        *named(conversion.shape),
    )
    return conversion.applied(parsed.withColumn(_TYPED, conversion.typed_parse))


def convert_parsed_events(events: DataFrame, table_schema: T.StructType, stream: StreamSpec) -> DataFrame:
    """:func:`convert_events` for the events of a plain stream (no operations, no keys) that Spark's
    JSON reader parsed (``events``: the ``typed_parse_schema`` columns of each line): the same
    converted columns, operation and reason. An event whose typed parse failed is converted from
    its text as :func:`convert_events` does; file and line are NULL (rejected events are found
    again from the landing lines)."""
    if stream.applies_changes:
        raise LakehouseError(f"stream {stream.name!r}: events with operations are converted from their text")
    conversion = _conversion(table_schema, stream, [], from_lines=False)
    parsed = events.select(*named(_parsed_event_columns(events.columns))).select("*", *named(conversion.shape))
    return conversion.applied(parsed)


@cached_columns
def _parsed_event_columns(names: list[str]) -> Named:
    """The typed parse's columns ``names`` as ``_TYPED``, the event's text (from the corrupt-record
    column, without a byte order mark), and NULL file and line."""
    corrupt = F.col(CORRUPT_COLUMN)
    text = F.when(corrupt.startswith(BYTE_ORDER_MARK), corrupt.substr(F.lit(2), F.length(corrupt))).otherwise(corrupt)
    nothing = F.lit(None)
    return (
        (_TYPED, F.struct(*[F.col(f"`{name}`") for name in names])),
        (EVENT_COLUMN, text),
        (SOURCE_FILE_COLUMN, nothing.cast("string")),
        (LINE_COLUMN, nothing.cast("long")),
    )


@dataclass(frozen=True, eq=False)
class _Conversion:
    """The expressions that convert a stream's events to a table schema, in the order they apply."""

    shape: Named
    """The event's row, raw operation, operation and position, over its text."""
    typed_parse: Column
    """The typed parse of the event's row (``convert_events``; the JSON reader's otherwise)."""
    text_parse: Column
    """The text parse, for the events whose typed parse failed."""
    values: Named
    """The table's columns, converted (and a Debezium table's source position)."""
    version_position: Column | None
    """The position a key's changes are ordered by, with ``version_column``."""
    reason: Column
    """Why the event is rejected; NULL when it converts."""
    uncoercible: Column
    """The places whose values did not coerce."""

    def applied(self, parsed: DataFrame) -> DataFrame:
        """``parsed`` (with the typed parse of each event's row in ``_TYPED``) converted."""
        # Spark evaluates the text parse only for the events whose typed parse failed.
        converted = parsed.withColumn(_RAW, self.text_parse).select("*", *named(self.values))
        if self.version_position is not None:
            converted = converted.withColumn(POSITION_COLUMN, self.version_position)
        named_last = named(((REASON_COLUMN, self.reason), (UNCOERCIBLE_COLUMN, self.uncoercible)))
        return converted.select("*", *named_last).drop(_RAW, _TYPED, _ROW, _RAW_OPERATION)


@cached_columns
def _conversion(
    table_schema: T.StructType, stream: StreamSpec, identifier_columns: list[str], from_lines: bool
) -> _Conversion:
    """The conversion's expressions for ``stream``'s events into ``table_schema``; the events' file
    and line are columns ``from_lines``, NULL otherwise. Reads ``TYPED_PARSE_TYPES``."""
    nothing = F.lit(None)
    landing_position = [F.col(SOURCE_FILE_COLUMN), F.col(LINE_COLUMN)]
    if not from_lines:
        landing_position = [nothing.cast("string"), nothing.cast("long")]
    shape = event_shape(stream, F.col(EVENT_COLUMN), landing_position)
    fields = row_fields(table_schema)
    text_schema = T.StructType([T.StructField(field.name, T.StringType()) for field in fields])

    def value(field: T.StructField) -> Column:
        if _parsed_typed(field):
            coerced = coerce_text(F.col(_RAW).getField(field.name), field.dataType)
            return F.when(_typed_parse_succeeded(), F.col(_TYPED).getField(field.name)).otherwise(coerced)
        return coerce_text(_field_text(field), field.dataType, field.metadata.get(ICEBERG_TYPE))

    position = shape.source_position if shape.source_position is not None else nothing
    kept_position = [position.cast(field.dataType) for field in table_schema if field.name == SOURCE_POSITION_COLUMN]
    # A key's changes in a batch are ordered by their version first, then by landing order.
    version_position = (
        F.struct(F.col(f"`{stream.version_column}`"), F.col(POSITION_COLUMN)) if stream.version_column else None
    )
    # An optional top-level column the event has a value for that did not coerce, and, below a
    # struct, list or map column that did, each place with a value that did not (by its path). The converted
    # value comes first in the test: Spark then computes it once for the column and the test (an
    # expression always evaluated is shared; the right side of an AND is not).
    uncoercible = [
        F.when(F.col(f"`{f.name}`").isNull() & _field_present(f), F.lit(f.name)) for f in fields if may_not_coerce(f)
    ]
    for field in fields:
        for path, lost in _losses_below(_field_text(field), F.col(f"`{field.name}`"), field.dataType, field.name):
            uncoercible.append(F.when(lost, F.lit(path)))
    return _Conversion(
        shape=(
            (_ROW, shape.row),
            (_RAW_OPERATION, shape.raw_operation),
            (OPERATION_COLUMN, shape.operation),
            (POSITION_COLUMN, F.struct(*shape.position)),
        ),
        typed_parse=F.from_json(F.col(_ROW), typed_parse_schema(fields), PARSE_OPTIONS),
        text_parse=F.when(~_typed_parse_succeeded(), F.from_json(F.col(_ROW), text_schema)),
        values=(
            *[(field.name, value(field)) for field in fields],
            *[(SOURCE_POSITION_COLUMN, kept) for kept in kept_position],
        ),
        version_position=version_position,
        reason=_rejection_reason(fields, stream, identifier_columns),
        uncoercible=F.array_compact(F.array(*uncoercible)) if uncoercible else F.array().cast("array<string>"),
    )


def _losses_below(raw: Column, converted: Column, data_type: T.DataType, path: str) -> list[tuple[str, Column]]:
    """For a value's JSON text ``raw`` and its ``converted`` value of ``data_type`` (NULL when
    ``raw`` is not of its shape, which the value's own place counts), each path of
    :func:`uncoercible_paths` below it with the condition that something with a value did not
    coerce there: per struct field its member, per list any element, per map any key (its entry
    dropped) or value, and below a list's elements or a map's values, any of them."""
    if isinstance(data_type, T.StructType):
        members = F.from_json(raw, _TEXT_FIELDS)  # type: ignore[arg-type]  # a map schema; the stubs omit it
        found = []
        for field in data_type:
            member_raw, member = members.getItem(field.name), converted.getField(field.name)
            field_path = f"{path}.{field.name}"
            if may_not_coerce(field):
                found.append((field_path, converted.isNotNull() & member.isNull() & member_raw.isNotNull()))
            found += _losses_below(member_raw, member, field.dataType, field_path)
        return found
    if isinstance(data_type, T.ArrayType):
        # Each element's text beside its converted value (the list's order is kept).
        elements = F.zip_with(F.from_json(raw, _TEXT_ELEMENTS), converted, _text_and_value)
        return _losses_in(elements, converted, data_type.elementType, f"{path}.element")
    if isinstance(data_type, T.MapType):
        entries = F.from_json(raw, _TEXT_FIELDS)  # type: ignore[arg-type]  # a map schema; the stubs omit it
        found = []
        if _may_lose(data_type.keyType):
            lost_key = F.exists(F.map_keys(entries), lambda key: coerce_text(key, data_type.keyType).isNull())
            found.append((f"{path}.key", converted.isNotNull() & lost_key))
        # Each kept entry's value text beside the converted value under its converted key.
        kept = F.map_entries(F.map_filter(entries, lambda key, _: coerce_text(key, data_type.keyType).isNotNull()))
        values = F.transform(
            kept,
            lambda entry: _text_and_value(
                entry.getField("value"), F.element_at(converted, coerce_text(entry.getField("key"), data_type.keyType))
            ),
        )
        return found + _losses_in(values, converted, data_type.valueType, f"{path}.value")
    return []


def _text_and_value(text: Column, value: Column) -> Column:
    return F.struct(text.alias("text"), value.alias("value"))


def _losses_in(pairs: Column, converted: Column, data_type: T.DataType, path: str) -> list[tuple[str, Column]]:
    """The places at and below a list's elements or a map's values of ``data_type`` named
    ``path`` (``pairs``: each one's JSON text and converted value), each with the condition that
    one of them lost a value there. The converted values are compared, not coerced again."""
    found = [(path, converted.isNotNull() & F.exists(pairs, _lost))] if _may_lose(data_type) else []
    # Each place below is one test over all of them, in the order of :func:`_paths_below`.
    for index, below in enumerate(f"{path}.{name}" for name in _paths_below(data_type)):
        found.append((below, converted.isNotNull() & F.exists(pairs, _loss_at(index, data_type, path))))
    return found


def _lost(pair: Column) -> Column:
    return pair.getField("text").isNotNull() & pair.getField("value").isNull()


def _loss_at(index: int, data_type: T.DataType, path: str) -> Callable[[Column], Column]:
    """The condition of the ``index``-th place below one element's or value's text and converted
    value (a one-argument function, as Spark's ``exists`` takes)."""
    return lambda pair: _losses_below(pair.getField("text"), pair.getField("value"), data_type, path)[index][1]


def _parsed_typed(field: T.StructField) -> bool:
    return isinstance(field.dataType, TYPED_PARSE_TYPES) and not field.metadata.get(ICEBERG_TYPE)


def _typed_parse_succeeded() -> Column:
    """True for an event whose typed parse succeeded (its ``_RAW`` is NULL): its row is an object."""
    return F.col(_TYPED).isNotNull() & F.col(_TYPED).getField(CORRUPT_COLUMN).isNull()


def _field_text(field: T.StructField) -> Column:
    """A field's JSON text, NULL where it is missing or null: the typed parse's value (as text)
    when that parse succeeded, else the text parse's."""
    typed_value = F.col(_TYPED).getField(field.name)
    from_typed = typed_value.cast("string") if _parsed_typed(field) else typed_value
    return F.when(_typed_parse_succeeded(), from_typed).otherwise(F.col(_RAW).getField(field.name))


def _field_present(field: T.StructField) -> Column:
    """True where the event has the field with a value other than null. Cheaper than testing
    ``_field_text``: no typed value is turned back into text."""
    in_typed = F.col(_TYPED).getField(field.name).isNotNull()
    return F.when(_typed_parse_succeeded(), in_typed).otherwise(F.col(_RAW).getField(field.name).isNotNull())
