"""Create a stream's target table (auto-create) from its declared or inferred schema, holding the
table's lock."""

from __future__ import annotations

import re
from collections.abc import Callable

from py4j.java_gateway import JavaObject, JVMView
from pyspark.sql import SparkSession

from lakehouse_assets.catalog.iceberg_types import iceberg_schema_json, spark_ddl
from lakehouse_assets.catalog.staged_snapshots import WAP_ENABLED_PROPERTY
from lakehouse_assets.catalog.table_metadata import CATALOG_NAME, qualified_name
from lakehouse_assets.config.spec import SOURCE_POSITION_COLUMN, SOURCE_POSITION_TYPE, ColumnSpec, StreamSpec
from lakehouse_assets.errors import ConfigError, TableNotFoundError
from lakehouse_assets.jvm.spark_jvm import jvm as spark_jvm
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.locks import exclusive_lock, table_lock_file

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


def _partition_spec(jvm: JVMView, schema: JavaObject, stream: StreamSpec) -> JavaObject:
    """The Iceberg PartitionSpec of ``schema.partition_spec``, built with Iceberg's own builder."""
    builder = jvm.org.apache.iceberg.PartitionSpec.builderFor(schema)
    for field in stream.table_schema.partition_spec:
        sized = re.match(r"^(bucket|truncate)\[(\d+)\]$", field.transform)
        if sized:
            builder = getattr(builder, sized.group(1))(field.column, int(sized.group(2)))
        else:
            builder = getattr(builder, field.transform)(field.column)
    return builder.build()


def create_table(spark: SparkSession, stream: StreamSpec, columns: list[ColumnSpec]) -> None:
    """Create the stream's table with ``columns``, partitioning, properties and location.

    Through Iceberg's catalog API rather than Spark SQL's CREATE TABLE, which cannot declare
    ``uuid`` or ``fixed[N]`` columns.
    """
    jvm = spark_jvm(spark)
    schema = jvm.org.apache.iceberg.SchemaParser.fromJson(
        iceberg_schema_json(
            [(column.name, column.iceberg_type, column.required) for column in columns],
            stream.identifier_columns or [],
        )
    )
    properties = jvm.java.util.HashMap()
    change_properties = MERGE_ON_READ_PROPERTIES if stream.applies_changes else {}
    # Every table allows staged snapshots from the start (an append batch's writer and a change
    # batch's committer write into them): a first batch is spared a metadata commit to allow them.
    for key, value in {
        **change_properties,
        **stream.table_properties,
        WAP_ENABLED_PROPERTY: "true",
        **MANAGED_TABLE_PROPERTIES,
    }.items():
        properties.put(key, value)
    catalog = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergCatalog(spark._jsparkSession, CATALOG_NAME)
    identifier = jvm.org.apache.iceberg.catalog.TableIdentifier.parse(stream.table_identifier)
    catalog.createTable(identifier, schema, _partition_spec(jvm, schema, stream), stream.table_location, properties)


def ensure_table(
    spark: SparkSession,
    lake: Lakehouse,
    stream: StreamSpec,
    undeclared_columns: Callable[[], list[ColumnSpec]],
) -> bool:
    """Make sure the stream's table exists; returns True when this call created it.

    An existing table is used with its own schema. A missing table is created when ``auto_create``
    is set, from ``schema.columns`` or else from ``undeclared_columns()`` (the source table's, or
    those inferred from the first batch), and is an error naming it otherwise.
    """
    identifier = stream.table_identifier
    if lake.metadata_location(identifier):
        _add_missing_system_columns(spark, lake, stream)
        return False
    if not stream.auto_create:
        raise TableNotFoundError(
            f"stream {stream.name!r}: table {identifier} does not exist and auto_create is false; "
            "create it or set auto_create: true with schema.columns"
        )
    with exclusive_lock(table_lock_file(lake.paths.locks, identifier)):
        if lake.metadata_location(identifier):
            return False
        namespace = stream.namespace
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {qualified_name(namespace)}")
        columns = stream.table_schema.columns or undeclared_columns()
        create_table(spark, stream, [*columns, *system_columns(stream)])
    return True


def system_columns(stream: StreamSpec) -> list[ColumnSpec]:
    """Columns the pipeline keeps beside the stream's own: a Debezium stream's source position,
    which orders a key's changes across batches (``StreamSpec.order_column``)."""
    if stream.order_column == SOURCE_POSITION_COLUMN:
        return [ColumnSpec(name=SOURCE_POSITION_COLUMN, type=SOURCE_POSITION_TYPE)]
    return []


def _add_missing_system_columns(spark: SparkSession, lake: Lakehouse, stream: StreamSpec) -> None:
    """Add the stream's system columns to a table created without them (holding the table's lock)."""
    present = set(lake.require_table(stream.table_identifier).schema().column_names)
    missing = [column for column in system_columns(stream) if column.name not in present]
    if not missing:
        return
    with exclusive_lock(table_lock_file(lake.paths.locks, stream.table_identifier)):
        present = set(lake.require_table(stream.table_identifier).schema().column_names)
        definitions = ", ".join(
            f"`{column.name}` {spark_ddl(column.iceberg_type)}" for column in missing if column.name not in present
        )
        if definitions:
            spark.sql(f"ALTER TABLE {qualified_name(stream.table_identifier)} ADD COLUMNS ({definitions})")


def require_static_tables(lake: Lakehouse) -> None:
    """Raise TableNotFoundError naming every static table that is missing and may not be created."""
    missing = [
        f"{table} (streams {', '.join(stream.name for stream in streams)})"
        for table, streams in lake.config.tables.items()
        if not any(stream.auto_create for stream in streams) and lake.metadata_location(table) is None
    ]
    if missing:
        raise TableNotFoundError(
            f"tables that do not exist and have auto_create: false: {'; '.join(missing)}; "
            "create them, or set auto_create: true (with schema.columns, or inferred from the first batch)"
        )


def identifier_columns(lake: Lakehouse, stream: StreamSpec) -> list[str]:
    """The key columns of a stream that applies changes: configured, else the table's identifier fields.

    Empty for append-only streams. Raises ConfigError when a change stream has neither.
    """
    if not stream.applies_changes:
        return []
    if stream.identifier_columns:
        return list(stream.identifier_columns)
    table = lake.table(stream.table_identifier)
    names = list(table.schema().identifier_field_names()) if table else []
    if not names:
        raise ConfigError(
            f"stream {stream.name!r}: identifier_columns: not configured and table {stream.table_identifier} "
            "has no identifier fields; set identifier_columns"
        )
    return sorted(names)
