"""Create a stream's target table (auto-create) from its declared or inferred schema, holding the
table's lock."""

from __future__ import annotations

import re
from collections.abc import Callable

from pyspark.sql import SparkSession

from lakehouse_assets.config import ColumnSpec, LakehouseConfig, PartitionFieldSpec, StreamSpec
from lakehouse_assets.errors import ConfigError, TableNotFoundError
from lakehouse_assets.iceberg_types import spark_ddl
from lakehouse_assets.inference import infer_columns
from lakehouse_assets.locks import exclusive_lock, table_lock_file
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.table_metadata import CATALOG_NAME, current_metadata_location, load_committed_table

# Iceberg retries a failed commit by re-applying it on the new base, which could publish a batch
# that a competing committer already published. Our committer retries itself after re-reading the
# ancestry, so Iceberg's own retry is turned off on every table we create.
MANAGED_TABLE_PROPERTIES = {"commit.retry.num-retries": "0"}
# Row-level changes write position deletes (format v2) or deletion vectors (v3) instead of
# rewriting data files.
MERGE_ON_READ_PROPERTIES = {
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
}


def qualified_name(identifier: str) -> str:
    return f"{CATALOG_NAME}.{identifier}"


def _partition_expression(field: PartitionFieldSpec) -> str:
    column = f"`{field.column}`"
    if field.transform == "identity":
        return column
    if field.transform in ("year", "month", "day", "hour"):
        return f"{field.transform}s({column})"
    name, width = re.match(r"^(bucket|truncate)\[(\d+)\]$", field.transform).groups()
    return f"{name}({width}, {column})"


def create_table_statement(stream: StreamSpec, columns: list[ColumnSpec] | None = None) -> str:
    """The ``CREATE TABLE IF NOT EXISTS`` statement for ``columns`` (default: the declared ones)."""
    columns = ",\n  ".join(
        f"`{column.name}` {spark_ddl(column.iceberg_type)}{' NOT NULL' if column.required else ''}"
        for column in (columns or stream.table_schema.columns)
    )
    statement = f"CREATE TABLE IF NOT EXISTS {qualified_name(stream.table_identifier)} (\n  {columns}\n) USING iceberg"
    if stream.table_schema.partition_spec:
        partitions = ", ".join(_partition_expression(field) for field in stream.table_schema.partition_spec)
        statement += f"\nPARTITIONED BY ({partitions})"
    if stream.table_location:
        statement += f"\nLOCATION '{stream.table_location}'"
    change_properties = MERGE_ON_READ_PROPERTIES if stream.applies_changes else {}
    properties = {**change_properties, **stream.table_properties, **MANAGED_TABLE_PROPERTIES}
    rendered = ", ".join(f"'{key}' = '{value}'" for key, value in sorted(properties.items()))
    return statement + f"\nTBLPROPERTIES ({rendered})"


def ensure_table(
    spark: SparkSession,
    config: LakehouseConfig,
    paths: LakehousePaths,
    stream: StreamSpec,
    sample_lines: Callable[[], list[str]] | None = None,
) -> bool:
    """Make sure the stream's table exists; returns True when this call created it.

    An existing table is used with its own schema. A missing table is created when ``auto_create``
    is set, from ``schema.columns`` or else from the schema inferred from ``sample_lines()`` (the
    first batch's events), and is an error naming it otherwise.
    """
    identifier = stream.table_identifier
    if current_metadata_location(config, paths, identifier):
        return False
    if not stream.auto_create:
        raise TableNotFoundError(
            f"stream {stream.name!r}: table {identifier} does not exist and auto_create is false; "
            "create it or set auto_create: true with schema.columns"
        )
    with exclusive_lock(table_lock_file(paths.locks, identifier)):
        if current_metadata_location(config, paths, identifier):
            return False
        namespace = stream.namespace
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {qualified_name(namespace)}")
        columns = stream.table_schema.columns or infer_columns(stream, sample_lines() if sample_lines else [])
        spark.sql(create_table_statement(stream, columns))
        if stream.identifier_columns:
            fields = ", ".join(f"`{name}`" for name in stream.identifier_columns)
            spark.sql(f"ALTER TABLE {qualified_name(identifier)} SET IDENTIFIER FIELDS {fields}")
    return True


def require_static_tables(config: LakehouseConfig, paths: LakehousePaths) -> None:
    """Raise TableNotFoundError naming every static table that is missing and may not be created."""
    missing = [
        f"{table} (streams {', '.join(stream.name for stream in streams)})"
        for table, streams in config.tables().items()
        if not any(stream.auto_create for stream in streams) and current_metadata_location(config, paths, table) is None
    ]
    if missing:
        raise TableNotFoundError(
            f"tables that do not exist and have auto_create: false: {'; '.join(missing)}; "
            "create them, or set auto_create: true (with schema.columns, or inferred from the first batch)"
        )


def identifier_columns(config: LakehouseConfig, paths: LakehousePaths, stream: StreamSpec) -> list[str]:
    """The key columns of a stream that applies changes: configured, else the table's identifier fields.

    Empty for append-only streams. Raises ConfigError when a change stream has neither.
    """
    if not stream.applies_changes:
        return []
    if stream.identifier_columns:
        return list(stream.identifier_columns)
    table = load_committed_table(config, paths, stream.table_identifier)
    names = list(table.schema().identifier_field_names()) if table else []
    if not names:
        raise ConfigError(
            f"stream {stream.name!r}: identifier_columns: not configured and table {stream.table_identifier} "
            "has no identifier fields; set identifier_columns"
        )
    return sorted(names)
