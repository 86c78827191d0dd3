"""Iceberg type names as written in ``schema.columns``: parsed once, rendered for Iceberg, Spark and
DuckDB.

Grammar: the primitives, ``decimal(P,S)``, ``fixed[N]``, ``struct<name: type, ...>``, ``list<type>``
and ``map<key type, value type>``, nested freely. Nested struct fields are optional.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pyiceberg import types

PRIMITIVE_TYPES = (
    "boolean",
    "int",
    "long",
    "float",
    "double",
    "date",
    "timestamp",
    "timestamptz",
    "string",
    "uuid",
    "binary",
)
DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
FIXED = re.compile(r"^fixed\[(\d+)\]$")
FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Spark 3.5 cannot write this Iceberg type.
NOT_WRITABLE_FROM_SPARK = {
    "time": "Spark 3.5 cannot read or write Iceberg time columns; use long (micros) or string",
}
# Types Spark SQL cannot declare (tables are created through Iceberg's catalog API) and reads as
# another type; their values are checked on conversion, so they are columns and struct fields
# only, not list elements or map keys and values.
SPARK_READS_AS = {"uuid": "string", "fixed": "binary"}
SPARK_PRIMITIVES = {
    "boolean": "boolean",
    "int": "int",
    "long": "bigint",
    "float": "float",
    "double": "double",
    "date": "date",
    "timestamp": "timestamp_ntz",
    "timestamptz": "timestamp",
    "string": "string",
    "uuid": "string",
    "binary": "binary",
}
DUCKDB_PRIMITIVES = {
    "boolean": "BOOLEAN",
    "int": "INTEGER",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "date": "DATE",
    "timestamp": "TIMESTAMP",
    "timestamptz": "TIMESTAMP WITH TIME ZONE",
    "string": "VARCHAR",
    "uuid": "UUID",
    "binary": "BLOB",
}


@dataclass(frozen=True)
class Primitive:
    name: str


@dataclass(frozen=True)
class Struct:
    fields: tuple[tuple[str, IcebergType], ...]


@dataclass(frozen=True)
class ListOf:
    element: IcebergType


@dataclass(frozen=True)
class MapOf:
    key: IcebergType
    value: IcebergType


IcebergType = Primitive | Struct | ListOf | MapOf


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``<...>`` or ``(...)``."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    parts.append("".join(current).strip())
    return parts


def _inside(text: str, prefix: str) -> str | None:
    if text.lower().startswith(prefix + "<") and text.endswith(">"):
        return text[len(prefix) + 1 : -1].strip()
    return None


def parse_type(text: str) -> IcebergType:
    """Parse a type name; raises ValueError naming what is wrong."""
    text = text.strip()
    lowered = text.lower()
    if lowered in PRIMITIVE_TYPES:
        return Primitive(lowered)
    if match := DECIMAL.match(lowered):
        precision, scale = int(match.group(1)), int(match.group(2))
        if not 1 <= precision <= 38 or scale > precision:
            raise ValueError(f"decimal({precision},{scale}): precision must be 1-38 and scale at most the precision")
        return Primitive(f"decimal({precision},{scale})")
    if lowered in NOT_WRITABLE_FROM_SPARK:
        raise ValueError(f"type {text!r} is not supported: {NOT_WRITABLE_FROM_SPARK[lowered]}")
    if match := FIXED.match(lowered):
        if int(match.group(1)) < 1:
            raise ValueError(f"{text}: the length must be at least 1")
        return Primitive(lowered)
    if (inner := _inside(text, "struct")) is not None:
        fields = []
        for part in _split_top_level(inner):
            name, colon, field_type = part.partition(":")
            if not colon or not FIELD_NAME.fullmatch(name.strip()):
                raise ValueError(f"struct field {part!r} is not of the form 'name: type'")
            fields.append((name.strip(), parse_type(field_type)))
        if len({name for name, _ in fields}) != len(fields):
            raise ValueError(f"struct {text!r} names a field twice")
        return Struct(tuple(fields))
    if (inner := _inside(text, "list")) is not None:
        return ListOf(_collection_member(parse_type(inner), text))
    if (inner := _inside(text, "map")) is not None:
        parts = _split_top_level(inner)
        if len(parts) != 2:
            raise ValueError(f"map {text!r} needs a key and a value type: map<string, long>")
        return MapOf(_collection_member(parse_type(parts[0]), text), _collection_member(parse_type(parts[1]), text))
    raise ValueError(
        f"unsupported type {text!r}; supported: {', '.join(PRIMITIVE_TYPES)}, decimal(P,S), fixed[N], "
        "struct<name: type, ...>, list<type>, map<key, value>"
    )


def _collection_member(member: IcebergType, text: str) -> IcebergType:
    if isinstance(member, Primitive) and spark_reads_as(member.name):
        raise ValueError(f"{text}: {member.name} is supported for columns and struct fields, not inside lists or maps")
    return member


def spark_reads_as(name: str) -> str | None:
    """For uuid and fixed[N], the Spark type Spark reads them as; None for every other type name."""
    return SPARK_READS_AS.get(name.split("[")[0])


def type_name(iceberg_type: IcebergType) -> str:
    """The canonical spelling, e.g. ``struct<id: long, tags: list<string>>``."""
    match iceberg_type:
        case Primitive(name):
            return name
        case Struct(fields):
            return "struct<" + ", ".join(f"{name}: {type_name(kind)}" for name, kind in fields) + ">"
        case ListOf(element):
            return f"list<{type_name(element)}>"
        case MapOf(key, value):
            return f"map<{type_name(key)}, {type_name(value)}>"


def spark_ddl(iceberg_type: IcebergType) -> str:
    """The Spark SQL type for a column of this type."""
    match iceberg_type:
        case Primitive(name):
            return SPARK_PRIMITIVES.get(name) or spark_reads_as(name) or name
        case Struct(fields):
            return "struct<" + ", ".join(f"`{name}`: {spark_ddl(kind)}" for name, kind in fields) + ">"
        case ListOf(element):
            return f"array<{spark_ddl(element)}>"
        case MapOf(key, value):
            return f"map<{spark_ddl(key)}, {spark_ddl(value)}>"


def duckdb_type(iceberg_type: IcebergType) -> str:
    """The type DuckDB's ``DESCRIBE`` shows for a column of this type."""
    match iceberg_type:
        case Primitive(name):
            return DUCKDB_PRIMITIVES.get(name) or ("BLOB" if FIXED.match(name) else name.upper())
        case Struct(fields):
            return "STRUCT(" + ", ".join(f"{name} {duckdb_type(kind)}" for name, kind in fields) + ")"
        case ListOf(element):
            return f"{duckdb_type(element)}[]"
        case MapOf(key, value):
            return f"MAP({duckdb_type(key)}, {duckdb_type(value)})"


def iceberg_schema_json(columns: list[tuple[str, IcebergType, bool]], identifier_columns: list[str]) -> str:
    """Iceberg's JSON schema for ``(name, type, required)`` columns (field ids are assigned afresh
    when the table is created)."""
    ids = iter(range(1, 1_000_000))

    def field(name: str, kind: IcebergType, required: bool) -> dict:
        return {"id": next(ids), "name": name, "required": required, "type": type_json(kind)}

    def type_json(kind: IcebergType) -> str | dict:
        match kind:
            case Primitive(name):
                decimal = DECIMAL.match(name)
                return f"decimal({decimal.group(1)}, {decimal.group(2)})" if decimal else name
            case Struct(fields):
                return {"type": "struct", "fields": [field(name, member, False) for name, member in fields]}
            case ListOf(element):
                return {
                    "type": "list",
                    "element-id": next(ids),
                    "element": type_json(element),
                    "element-required": False,
                }
            case MapOf(key, value):
                return {
                    "type": "map",
                    "key-id": next(ids),
                    "key": type_json(key),
                    "value-id": next(ids),
                    "value": type_json(value),
                    "value-required": False,
                }

    fields = [field(name, kind, required) for name, kind, required in columns]
    identifier_ids = [f["id"] for f in fields if f["name"] in identifier_columns]
    return json.dumps({"type": "struct", "schema-id": 0, "identifier-field-ids": identifier_ids, "fields": fields})


def iceberg_type_name(iceberg_type: types.IcebergType) -> str:
    """A PyIceberg type written in this grammar (``struct<a: long>``, without field ids)."""
    if isinstance(iceberg_type, types.StructType):
        return "struct<" + ", ".join(f"{f.name}: {iceberg_type_name(f.field_type)}" for f in iceberg_type.fields) + ">"
    if isinstance(iceberg_type, types.ListType):
        return f"list<{iceberg_type_name(iceberg_type.element_type)}>"
    if isinstance(iceberg_type, types.MapType):
        return f"map<{iceberg_type_name(iceberg_type.key_type)}, {iceberg_type_name(iceberg_type.value_type)}>"
    return str(iceberg_type).replace(", ", ",")


PROMOTIONS = {("int", "long"), ("float", "double")}


def widens(narrow: IcebergType, wide: IcebergType) -> bool:
    """Whether Iceberg's schema evolution changes a column of type ``narrow`` to ``wide`` in place
    (the spec's type promotions): int to long, float to double, decimal(P,S) to decimal(P',S) for
    P' > P."""
    if not (isinstance(narrow, Primitive) and isinstance(wide, Primitive)):
        return False
    if (narrow.name, wide.name) in PROMOTIONS:
        return True
    before, after = DECIMAL.match(narrow.name), DECIMAL.match(wide.name)
    return bool(before and after and before.group(2) == after.group(2) and int(after.group(1)) > int(before.group(1)))


def evolves_into(declared: IcebergType, actual: IcebergType) -> bool:
    """Whether schema evolution can have made ``declared`` into ``actual``: the same type, a
    promotion of it, or a struct with the declared fields so evolved, in order, and fields after
    them (lists' elements and maps' values alike)."""
    if declared == actual or widens(declared, actual):
        return True
    match declared, actual:
        case Struct(declared_fields), Struct(actual_fields):
            pairs = zip(declared_fields, actual_fields, strict=False)
            return len(actual_fields) >= len(declared_fields) and all(
                name == other and evolves_into(kind, other_kind) for (name, kind), (other, other_kind) in pairs
            )
        case ListOf(element), ListOf(other_element):
            return evolves_into(element, other_element)
        case MapOf(key, value), MapOf(other_key, other_value):
            return key == other_key and evolves_into(value, other_value)
    return False
