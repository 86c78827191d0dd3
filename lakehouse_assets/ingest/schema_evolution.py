"""Schema evolution (``schema_evolution: true``): new fields become optional columns, and new
members of struct columns new optional struct fields.

The writer finds the batch's fields that the table lacks, infers each one's type from the first
event that has a value for it (the inference rules), stages the batch with those columns, and
records them in ``staged.json``. The committer, holding the table's commit lock, adds the columns
that are still missing before it commits the batch (``commit.table_columns``): the first type
committed wins, and a later batch's values are cast to it (NULL where they do not fit, as for any
optional column). Columns are never dropped, renamed or retyped. The commit that follows a schema
change records the added columns in ``lakehouse.schema-change``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakehouse_assets.batches.staged_format import EVENT_COLUMN
from lakehouse_assets.catalog.iceberg_types import (
    FIELD_NAME,
    parse_type,
    spark_ddl,
)
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.ingest.change_events import event_shape
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
    return infer_type(value) or "string"


def new_columns(lines: DataFrame, stream: StreamSpec, table_schema: T.StructType) -> dict[str, str]:
    """Fields of the batch's events that the table lacks, with their inferred Iceberg types:
    top-level fields by name, fields inside existing struct columns by dotted path (``address.zip``)."""
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
        return {name: kind for name, kind in found.items() if kind is not None}
    finally:
        rows.unpersist()


def _with_field(struct: T.StructType, path: list[str], data_type: T.DataType) -> T.StructType:
    if len(path) == 1:
        return T.StructType([*struct.fields, T.StructField(path[0], data_type)])
    return T.StructType(
        [
            T.StructField(field.name, _with_field(field.dataType, path[1:], data_type), field.nullable)
            if field.name == path[0] and isinstance(field.dataType, T.StructType)
            else field
            for field in struct.fields
        ]
    )


def with_new_columns(table_schema: T.StructType, columns: dict[str, str]) -> T.StructType:
    """The table's Spark schema plus optional ``columns`` (Iceberg type names; dotted names are
    fields of struct columns)."""
    for name, kind in columns.items():
        table_schema = _with_field(table_schema, name.split("."), T._parse_datatype_string(spark_ddl(parse_type(kind))))
    return table_schema
