"""New and promoted columns reaching the table: added, or widened as Iceberg allows, under the
table's lock before the batches that brought them commit, and recorded in the summary of the
commit that first carries them. What a batch's events propose is found while staging
(``ingest.schema_evolution``)."""

from __future__ import annotations

from collections.abc import Iterator

from pyiceberg.schema import Schema, index_by_name
from pyiceberg.table import Table
from pyiceberg.types import IcebergType, ListType, MapType, StructType
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from lakehouse_assets import faults
from lakehouse_assets.catalog.iceberg_types import (
    Struct,
    iceberg_type_name,
    parse_type,
    spark_ddl,
    type_name,
    widens,
)
from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.commit.recovery import MAIN_BRANCH, branch_head
from lakehouse_assets.faults import crash_point


def _field_type(struct: T.DataType, path: list[str]) -> T.DataType | bool | None:
    """The type of the member at ``path`` (struct fields case-insensitively, a list's ``element``,
    a map's ``value``); False when a struct lacks it, None when its parent is missing."""
    for depth, part in enumerate(path):
        if isinstance(struct, T.ArrayType) and part == "element":
            struct = struct.elementType
            continue
        if isinstance(struct, T.MapType) and part == "value":
            struct = struct.valueType
            continue
        if not isinstance(struct, T.StructType):
            return None
        match = next((field for field in struct.fields if field.name.lower() == part.lower()), None)
        if match is None:
            return False if depth == len(path) - 1 else None
        struct = match.dataType
    return struct


def _has_field(struct: T.DataType, path: list[str]) -> bool | None:
    """Whether the struct has the field at ``path`` (case-insensitively); None when its parent is missing."""
    found = _field_type(struct, path)
    return found if found is None or found is False else True


def proposed_fields(columns: dict[str, str]) -> dict[str, str]:
    """``columns`` plus, for each new struct, each of its fields by dotted path: batches staged before
    a struct column exists may propose it with different fields, and each field must be added."""
    fields = dict(columns)
    for name, kind in columns.items():
        parsed = parse_type(kind)
        if isinstance(parsed, Struct):
            fields.update(proposed_fields({f"{name}.{field}": type_name(member) for field, member in parsed.fields}))
    return fields


def add_missing_columns(spark: SparkSession, table_identifier: str, columns: dict[str, str]) -> dict[str, str]:
    """Add the columns and struct fields the table still lacks (call holding the table's lock),
    shallowest first; returns those this call added. Columns that a committer on another host (whose
    lock is its own) added in the meantime count as present."""
    added: dict[str, str] = {}
    for depth in sorted({name.count(".") for name in columns}):
        schema = spark.table(qualified_name(table_identifier)).schema
        missing = {
            name: kind
            for name, kind in columns.items()
            if name.count(".") == depth and _has_field(schema, name.split(".")) is False
        }
        if missing:
            definitions = ", ".join(
                f"{'.'.join(f'`{part}`' for part in name.split('.'))} {spark_ddl(parse_type(kind))}"
                for name, kind in missing.items()
            )
            crash_point(faults.SCHEMA_BEFORE_ADD_COLUMNS)
            try:
                spark.sql(f"ALTER TABLE {qualified_name(table_identifier)} ADD COLUMNS ({definitions})")
            except Exception:  # noqa: BLE001 - Spark refuses a column that exists; decided below
                # Another host added them first: the table has them (the first committed type wins,
                # as for any batch). Anything else is raised.
                spark.catalog.refreshTable(qualified_name(table_identifier))
                schema = spark.table(qualified_name(table_identifier)).schema
                if any(_has_field(schema, name.split(".")) is False for name in missing):
                    raise
                continue
            added.update(missing)
    return added


def promote_narrower_columns(
    spark: SparkSession, table_identifier: str, schema: Schema, columns: dict[str, str]
) -> dict[str, str]:
    """Widen the columns and struct fields that ``schema`` (the table's, read holding its lock)
    holds in a type ``columns`` promote (int to long, ...); returns those this call widened. One
    that a committer on another host widened in the meantime counts as done."""
    promoted: dict[str, str] = {}
    for name, kind in columns.items():
        try:
            current = parse_type(iceberg_type_name(schema.find_type(name, case_sensitive=False)))
        except ValueError:
            continue  # not a column (added by add_missing_columns), or of a type no promotion reaches
        wanted = parse_type(kind)
        if not widens(current, wanted):
            continue
        column = ".".join(f"`{part}`" for part in name.split("."))
        try:
            spark.sql(f"ALTER TABLE {qualified_name(table_identifier)} ALTER COLUMN {column} TYPE {spark_ddl(wanted)}")
        except Exception:  # noqa: BLE001 - Spark refuses a change that was made; decided below
            # Another host widened it first; anything else is raised.
            spark.catalog.refreshTable(qualified_name(table_identifier))
            now = _field_type(spark.table(qualified_name(table_identifier)).schema, name.split("."))
            if not isinstance(now, T.DataType) or now.simpleString() != spark_ddl(wanted):
                raise
            continue
        promoted[name] = kind
    return promoted


def schema_changes_since_last_snapshot(table: Table, branch: str = MAIN_BRANCH) -> dict[str, str]:
    """Columns and struct fields of the table's current schema that the schema of the branch's
    head (or, before the first snapshot, the schema it was created with) does not have, has in
    another type or as required, with their types now (``optional <type>`` for a column made
    optional); a new struct is named once, not with each of its fields."""
    snapshot = branch_head(table, branch)
    schema_id = snapshot.schema_id if snapshot is not None else table.metadata.schemas[0].schema_id
    before = next((s for s in table.metadata.schemas if s.schema_id == schema_id), None)
    known = set(index_by_name(before).values()) if before else set()
    schema = table.schema()
    # Each field by its full name (``items.element.qty``): the name index also holds short names
    # for the fields of lists' and maps' structs (``items.qty``).
    names = sorted(
        (name, field_id)
        for field_id in set(index_by_name(schema).values())
        if (name := schema.find_column_name(field_id))
    )
    added = {name: field_id for name, field_id in names if field_id not in known}
    changes = {
        name: iceberg_type_name(schema.find_type(field_id))
        for name, field_id in added.items()
        if name.rpartition(".")[0] not in added
    }
    for name, field_id in names:
        if before is None or field_id not in known:
            continue
        kind = schema.find_type(field_id)
        if before.find_field(field_id).required and not schema.find_field(field_id).required:
            changes[name] = f"optional {iceberg_type_name(kind)}"
        elif kind.is_primitive and before.find_type(field_id) != kind:
            changes[name] = iceberg_type_name(kind)
    return changes


def relax_required_columns(spark: SparkSession, table_identifier: str, schema: Schema, columns: list[str]) -> list[str]:
    """Make the top-level ``columns`` that ``schema`` (the table's, read holding its lock) has as
    required optional; returns those this call changed. Idempotent across hosts: making an
    optional column optional changes nothing."""
    relaxed = []
    for name in columns:
        try:
            field = schema.find_field(name, case_sensitive=False)
        except ValueError:
            continue  # dropped by an operator since the batch was staged
        if field.required:
            spark.sql(f"ALTER TABLE {qualified_name(table_identifier)} ALTER COLUMN `{field.name}` DROP NOT NULL")
            relaxed.append(field.name)
    return relaxed


def staged_names(table: Table, schema_id: int | None) -> dict[str, str | None]:
    """How a batch staged under the table's schema ``schema_id`` names the columns and struct
    fields (at any depth of structs, lists' elements and maps' values) whose names changed since,
    matched by field id: the name now (its dotted path) -> the name it was staged under (its own,
    within its struct), or None for a field added since under a name that another field, renamed
    since, had then (not that one's values). A field renamed back, or dropped, has no entry."""
    before = next((schema for schema in table.metadata.schemas if schema.schema_id == schema_id), None)
    if before is None or schema_id == table.schema().schema_id:
        return {}
    then = {field_id: (parent, name) for _, field_id, parent, name in _struct_fields(before.as_struct())}
    now = list(_struct_fields(table.schema().as_struct()))
    renamed_away = {then[field_id] for _, field_id, _, name in now if field_id in then and then[field_id][1] != name}
    found: dict[str, str | None] = {}
    for path, field_id, parent, name in now:
        if field_id in then and then[field_id][1] != name:
            found[path] = then[field_id][1]
        elif field_id not in then and (parent, name) in renamed_away:
            found[path] = None
    return found


def _struct_fields(struct: StructType, path: str = "", parent: int = 0) -> Iterator[tuple[str, int, int, str]]:
    """Each field of ``struct`` and of the structs in it, in its fields, lists' elements and maps'
    values: its dotted path (``items.element.qty``), id, parent's id (0 at the top; the element's
    or value's id inside a list or map) and name."""
    for field in struct.fields:
        field_path = f"{path}{field.name}"
        yield field_path, field.field_id, parent, field.name
        yield from _fields_below(field.field_type, f"{field_path}.", field.field_id)


def _fields_below(kind: IcebergType, path: str, field_id: int) -> Iterator[tuple[str, int, int, str]]:
    """What :func:`_struct_fields` finds below a field of type ``kind`` (id ``field_id``)."""
    if isinstance(kind, StructType):
        yield from _struct_fields(kind, path, field_id)
    elif isinstance(kind, ListType):
        yield from _fields_below(kind.element_type, f"{path}element.", kind.element_id)
    elif isinstance(kind, MapType):
        yield from _fields_below(kind.value_type, f"{path}value.", kind.value_id)
