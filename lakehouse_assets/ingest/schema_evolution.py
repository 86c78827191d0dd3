"""Schema evolution (``schema_evolution: true``): new fields become optional columns, new
members of struct columns new optional struct fields, and columns whose values outgrow their type
are promoted as Iceberg allows (int to long, float to double, decimal(P,S) to decimal(P',S)).

The writer finds the batch's fields that the table lacks, infers each one's type from the first
event that has a value for it (the inference rules), finds the int, float and decimal columns and
struct fields whose values need the wider type, stages the batch with those types, and records
them in ``staged.json``. The committer, holding the table's commit lock, adds the columns that are
still missing and promotes those still narrower before it commits the batch
(``commit.table_columns``). A value no promotion holds (a fraction into a long, text into a
number) is cast to the column's type, NULL where it does not fit, as for any optional column.
With ``relax_required``, a required column (not an identifier column) that a batch's events stop
carrying is staged optional and made optional before the batch commits. Columns are never dropped
or renamed. The commit that follows a schema change records the added, promoted and relaxed
columns, with their new types, in ``lakehouse.schema-change``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakehouse_assets.batches.staged_format import DELETE, EVENT_COLUMN
from lakehouse_assets.catalog.iceberg_types import (
    FIELD_NAME,
    parse_type,
    spark_ddl,
)
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.ingest.change_events import event_shape
from lakehouse_assets.ingest.conversion import coerce_text, float_overflows
from lakehouse_assets.ingest.inference import infer_type
from lakehouse_assets.source.iceberg_source import METADATA_FIELDS


def _operation_field(stream: StreamSpec) -> str | None:
    return stream.operation[3:-1].split("/")[0] if stream.operation and "${" in stream.operation else None


FieldPath = tuple[str, ...]
"""A column's name, or a struct field's names from its column down."""


def _json_path(path: FieldPath) -> str:
    return "$" + "".join(f"['{part}']" for part in path)


def _struct_columns(
    schema: T.StructType, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], T.StructType]]:
    """Every struct column and struct field, at any depth (not inside lists or maps), with its path."""
    for field in schema.fields:
        if isinstance(field.dataType, T.StructType):
            path = (*prefix, field.name)
            yield path, field.dataType
            yield from _struct_columns(field.dataType, path)


def _inferred_type(rows: DataFrame, path: FieldPath) -> str | None:
    """The inferred type of the first non-null value at ``path`` in the batch's events; None when
    every value is null (no evidence yet: the field is added once a batch has a value)."""
    first = rows.where(F.get_json_object("row", _json_path(path)).isNotNull()).limit(1).collect()
    if not first:
        return None
    value = json.loads(first[0]["row"])
    for part in path:
        value = value[part]
    return infer_type(value, evolving=True)


INT_RANGE = (-(2**31), 2**31)
"""The values an int holds: ``[start, end)``."""
MAX_DECIMAL_PRECISION = 38


PROMOTABLE = (T.IntegerType, T.FloatType, T.DecimalType)
TEXT_MAP = T.MapType(T.StringType(), T.StringType())
# A list's elements and a map's values, as Iceberg names them in a column's path.
ELEMENT, VALUE = "element", "value"


def _promotable(data_type: T.DataType) -> bool:
    """An int, a float, or a decimal narrower than the widest."""
    if isinstance(data_type, T.DecimalType):
        return data_type.precision < MAX_DECIMAL_PRECISION
    return isinstance(data_type, PROMOTABLE)


@dataclass(frozen=True)
class _Place:
    """Where an int, float or decimal sits in a column: its column's name and struct fields
    (``fields``), then the steps below a list or map (``within``: a struct field's name, or
    ``element`` for a list's elements, ``value`` for a map's values)."""

    fields: FieldPath
    within: tuple[tuple[str, str], ...]
    data_type: T.DataType

    @property
    def name(self) -> str:
        """Iceberg's dotted path of the place (``items.element.qty``)."""
        return ".".join((*self.fields, *(name for _, name in self.within)))


_FIELD = "field"


def _promotable_places(
    data_type: T.DataType, fields: FieldPath = (), within: tuple[tuple[str, str], ...] = ()
) -> Iterator[_Place]:
    """Every int, float and decimal column and struct field, list element and map value, at any
    depth of structs, lists and maps."""
    if isinstance(data_type, T.StructType):
        for field in data_type.fields:
            if within:
                yield from _promotable_places(field.dataType, fields, (*within, (_FIELD, field.name)))
            else:
                yield from _promotable_places(field.dataType, (*fields, field.name))
    elif isinstance(data_type, T.ArrayType):
        yield from _promotable_places(data_type.elementType, fields, (*within, (ELEMENT, ELEMENT)))
    elif isinstance(data_type, T.MapType):
        yield from _promotable_places(data_type.valueType, fields, (*within, (VALUE, VALUE)))
    elif fields and _promotable(data_type):
        yield _Place(fields, within, data_type)


def _texts_below(texts: Column, step: str, name: str) -> Column:
    """The JSON texts one step below each of ``texts``: a struct's member ``name``, a list's
    elements, a map's values (nothing for a text of another shape)."""

    def members(text: Column) -> Column:
        if step == _FIELD:
            return F.array(F.from_json(text, TEXT_MAP).getItem(name))  # type: ignore[arg-type]  # a map schema
        if step == ELEMENT:
            return F.from_json(text, T.ArrayType(T.StringType()))
        return F.map_values(F.from_json(text, TEXT_MAP))  # type: ignore[arg-type]  # a map schema; the stubs omit it

    nothing = F.array().cast(T.ArrayType(T.StringType()))
    return F.flatten(F.transform(texts, lambda text: F.coalesce(members(text), nothing)))


def _largest_need(place: _Place) -> Column:
    """An aggregate of the batch's values at ``place`` (every one below a list or map) that tells
    whether they need a wider type: for int and float whether any does (1), for a decimal the
    largest magnitude."""
    data_type = place.data_type
    text = F.get_json_object("row", _json_path(place.fields))

    def need(value: Column) -> Column:
        if isinstance(data_type, T.IntegerType):
            number = coerce_text(value, T.LongType())
            return (number < INT_RANGE[0]) | (number >= INT_RANGE[1])
        if isinstance(data_type, T.FloatType):
            return float_overflows(coerce_text(value, T.DoubleType()))
        scale = cast(T.DecimalType, data_type).scale
        return F.abs(coerce_text(value, T.DecimalType(MAX_DECIMAL_PRECISION, scale)))

    if not place.within:
        found = need(text)
    else:
        texts = F.array(text)
        for step, name in place.within:
            texts = _texts_below(texts, step, name)
        found = F.array_max(F.transform(texts, need))
    return F.max(found.cast("int") if isinstance(data_type, (T.IntegerType, T.FloatType)) else found)


def promoted_columns(rows: DataFrame, table_schema: T.StructType) -> dict[str, str]:
    """Int, float and decimal columns, struct fields, list elements and map values at any depth
    (dotted paths: ``point.x``, ``tags.element``, ``scores.value``, ``items.element.qty``) whose
    values in the batch only a wider type
    holds, with that type: long, double, or the decimal with the precision the largest value needs
    (at most 38, the scale kept). Values no promotion holds do not count."""
    candidates = list(_promotable_places(table_schema))
    if not candidates:
        return {}
    needs = rows.agg(*[_largest_need(place).alias(f"_{i}") for i, place in enumerate(candidates)]).first()
    promoted: dict[str, str] = {}
    for index, place in enumerate(candidates):
        need = needs[index] if needs else None
        name, data_type = place.name, place.data_type
        if need is None or need == 0:
            continue
        if isinstance(data_type, T.IntegerType):
            promoted[name] = "long"
        elif isinstance(data_type, T.FloatType):
            promoted[name] = "double"
        elif isinstance(data_type, T.DecimalType):
            precision = data_type.scale + len(str(int(need)).lstrip("0") or "0")
            if precision > data_type.precision:
                promoted[name] = f"decimal({precision},{data_type.scale})"
    return promoted


def columns_needed(lines: DataFrame, stream: StreamSpec, table_schema: T.StructType) -> dict[str, str]:
    """Columns and struct fields the batch's events need that the table lacks or holds in a type
    too narrow, with the Iceberg types they need: top-level fields by name, fields inside struct
    columns by dotted path (``address.zip``)."""
    rows = lines.select(event_shape(stream, F.col(EVENT_COLUMN), []).row.alias("row")).cache()
    try:
        found: dict[str, str | None] = {}
        known = {name.lower() for name in table_schema.fieldNames()} | {(_operation_field(stream) or "").lower()}
        if stream.iceberg_source:
            known |= set(METADATA_FIELDS)  # describe the change, not the row
        keys = rows.select(F.explode(F.json_object_keys("row")).alias("key")).distinct().collect()
        for key in sorted(row["key"] for row in keys if row["key"].lower() not in known):
            found[key] = _inferred_type(rows, (key,))
        for path, struct in _struct_columns(table_schema):
            members = F.json_object_keys(F.get_json_object("row", _json_path(path)))
            keys = rows.select(F.explode(members).alias("key")).distinct().collect()
            present = {name.lower() for name in struct.fieldNames()}
            for key in sorted(row["key"] for row in keys if FIELD_NAME.fullmatch(row["key"])):
                if key.lower() not in present:
                    found[".".join((*path, key))] = _inferred_type(rows, (*path, key))
        added = {name: kind for name, kind in found.items() if kind is not None}
        return added | promoted_columns(rows, table_schema)
    finally:
        rows.unpersist()


def required_columns_missing(
    lines: DataFrame, stream: StreamSpec, table_schema: T.StructType, identifier_columns: list[str]
) -> list[str]:
    """The required columns (not identifier columns) that some event of the batch, other than a
    delete, is an object without (or with null for): with ``relax_required`` they become optional."""
    required = [f.name for f in table_schema.fields if not f.nullable and f.name not in identifier_columns]
    if not required:
        return []
    shape = event_shape(stream, F.col(EVENT_COLUMN), [])
    rows = lines.select(shape.row.alias("row"), shape.operation.alias("operation"))
    counted = F.json_object_keys("row").isNotNull() & ~F.coalesce(F.col("operation") == F.lit(DELETE), F.lit(False))
    found = rows.agg(
        *[F.max((counted & F.get_json_object("row", _json_path((name,))).isNull()).cast("int")) for name in required]
    ).first()
    return [name for index, name in enumerate(required) if found and found[index]]


def with_optional(table_schema: T.StructType, columns: list[str]) -> T.StructType:
    """The table's Spark schema with the top-level ``columns`` optional."""
    return T.StructType(
        [T.StructField(f.name, f.dataType, True, f.metadata) if f.name in columns else f for f in table_schema.fields]
    )


def _with_type(current: T.DataType, path: list[str], data_type: T.DataType) -> T.DataType:
    """``current`` with the member at ``path`` (struct fields by name, a list's ``element``, a
    map's ``value``) of ``data_type``: its type replaced, or, for a struct field it lacks, added
    last as an optional field."""
    if not path:
        return data_type
    head, rest = path[0], path[1:]
    if isinstance(current, T.ArrayType) and head == ELEMENT:
        return T.ArrayType(_with_type(current.elementType, rest, data_type), current.containsNull)
    if isinstance(current, T.MapType) and head == VALUE:
        return T.MapType(current.keyType, _with_type(current.valueType, rest, data_type), current.valueContainsNull)
    if not isinstance(current, T.StructType):
        return current
    if head not in current.fieldNames():
        return T.StructType([*current.fields, T.StructField(head, data_type)]) if not rest else current
    return T.StructType(
        [
            T.StructField(field.name, _with_type(field.dataType, rest, data_type), field.nullable, field.metadata)
            if field.name == head
            else field
            for field in current.fields
        ]
    )


def with_columns(table_schema: T.StructType, columns: dict[str, str]) -> T.StructType:
    """The table's Spark schema with ``columns`` (Iceberg type names; dotted names are fields of
    struct columns): new ones optional, last; existing ones in their new type."""
    for name, kind in columns.items():
        data_type = T._parse_datatype_string(spark_ddl(parse_type(kind)))
        table_schema = cast(T.StructType, _with_type(table_schema, name.split("."), data_type))
    return table_schema
