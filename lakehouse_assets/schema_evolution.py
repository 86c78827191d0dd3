"""Schema evolution (``schema_evolution: true``): new top-level fields become optional columns.

The writer finds the batch's fields that the table lacks, infers each one's type from the first
event that has a value for it (the inference rules), stages the batch with those columns, and
records them in ``staged.json``. The committer, holding the table's commit lock, adds the columns
that are still missing before it commits the batch: the first type committed wins, and a later
batch's values are cast to it (NULL where they do not fit, as for any optional column). Columns
are never dropped, renamed or retyped. The commit that follows a schema change records the added
columns in ``lakehouse.schema-change``.
"""

from __future__ import annotations

import json

from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakehouse_assets.change_events import event_shape
from lakehouse_assets.config import StreamSpec
from lakehouse_assets.conversion import EVENT_COLUMN
from lakehouse_assets.iceberg_types import parse_type, spark_ddl
from lakehouse_assets.inference import infer_type
from lakehouse_assets.tables import qualified_name


def _operation_field(stream: StreamSpec) -> str | None:
    return stream.operation[3:-1].split("/")[0] if stream.operation and "${" in stream.operation else None


def new_columns(lines: DataFrame, stream: StreamSpec, table_schema: T.StructType) -> dict[str, str]:
    """Fields of the batch's events that the table lacks, with their inferred Iceberg types."""
    rows = lines.select(event_shape(stream, F.col(EVENT_COLUMN), []).row.alias("row"))
    keys = rows.select(F.explode(F.json_object_keys("row")).alias("key")).distinct()
    known = {name.lower() for name in table_schema.fieldNames()} | {(_operation_field(stream) or "").lower()}
    candidates = sorted(row["key"] for row in keys.collect() if row["key"].lower() not in known)
    found: dict[str, str] = {}
    for key in candidates:
        path = "$." + key if key.isidentifier() else f"$['{key}']"
        first = rows.where(F.get_json_object("row", path).isNotNull()).limit(1).collect()
        if first:
            found[key] = infer_type(json.loads(first[0]["row"]).get(key)) or "string"
    return found


def with_new_columns(table_schema: T.StructType, columns: dict[str, str]) -> T.StructType:
    """The table's Spark schema plus optional ``columns`` (Iceberg type names)."""
    added = [
        T.StructField(name, T._parse_datatype_string(spark_ddl(parse_type(kind)))) for name, kind in columns.items()
    ]
    return T.StructType([*table_schema.fields, *added])


def add_missing_columns(spark: SparkSession, table_identifier: str, columns: dict[str, str]) -> dict[str, str]:
    """Add the columns the table still lacks (call holding the table's lock); returns those added."""
    present = {name.lower() for name in spark.table(qualified_name(table_identifier)).columns}
    missing = {name: kind for name, kind in columns.items() if name.lower() not in present}
    if missing:
        definitions = ", ".join(f"`{name}` {spark_ddl(parse_type(kind))}" for name, kind in missing.items())
        spark.sql(f"ALTER TABLE {qualified_name(table_identifier)} ADD COLUMNS ({definitions})")
    return missing


def columns_added_since_last_snapshot(table: Table) -> dict[str, str]:
    """Columns of the table's current schema that the schema of its current snapshot (or, before
    the first snapshot, the schema it was created with) does not have."""
    snapshot = table.current_snapshot()
    schema_id = snapshot.schema_id if snapshot is not None else table.metadata.schemas[0].schema_id
    before = next((s for s in table.metadata.schemas if s.schema_id == schema_id), None)
    known = {field.field_id for field in before.fields} if before else set()
    return {field.name: str(field.field_type) for field in table.schema().fields if field.field_id not in known}
