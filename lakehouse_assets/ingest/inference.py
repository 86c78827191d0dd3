"""Schema inference from the first batch's events, with the sink RFC's rules and limits.

Objects become structs, arrays lists of their first element's type, booleans ``boolean``,
integers ``long``, other numbers ``double``, everything else ``string``; empty objects and arrays
and fields that are only ever null become ``string``. With ``schema_evolution`` a field that is
only ever null (a column or a struct's field) is left out instead, and schema evolution adds it
with the type of the first value a later batch brings (an integer first seen as null is then
``long``, never ``string``). Fields of nested objects whose names are not identifiers (letters,
digits, ``_``) are left out, as extra fields are. For each field the first event that has a value
for it decides its type (fields of a nested object come from that one object). Inference cannot
tell int from long, float from double, or a timestamp from a string: declare ``schema.columns``
for those.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from lakehouse_assets.catalog.iceberg_types import FIELD_NAME
from lakehouse_assets.config.spec import ColumnSpec, StreamSpec
from lakehouse_assets.errors import LakehouseError

SAMPLE_EVENTS = 1000
"""Events of the first batch that inference reads."""


def infer_type(value: Any, evolving: bool = False) -> str | None:
    """The Iceberg type name for a JSON value, or None for null (no evidence). ``evolving`` (schema
    evolution on): a struct leaves out its fields that are null, and is None when all of them are."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    fields = (
        {name: item for name, item in value.items() if FIELD_NAME.fullmatch(name)} if isinstance(value, dict) else {}
    )
    if fields:
        typed = {name: infer_type(item, evolving) for name, item in fields.items()}
        if evolving:
            typed = {name: kind for name, kind in typed.items() if kind is not None}
            if not typed:
                return None
        return "struct<" + ", ".join(f"{name}: {kind or 'string'}" for name, kind in typed.items()) + ">"
    if isinstance(value, list) and value:
        return f"list<{infer_type(value[0]) or 'string'}>"
    return "string"


def event_row(stream: StreamSpec, event: dict[str, Any]) -> dict[str, Any] | None:
    """The part of an event that holds the row: the event, or a Debezium envelope's ``after``."""
    if not stream.is_debezium:
        return event
    envelope = event["payload"] if isinstance(event.get("payload"), dict) else event
    row = envelope.get("after")
    return row if isinstance(row, dict) else None


def infer_columns(stream: StreamSpec, lines: Iterable[str]) -> list[ColumnSpec]:
    """Columns for the stream's table from sample event lines; identifier columns are required."""
    operation_field = stream.operation[3:-1].split("/")[0] if stream.operation and "${" in stream.operation else None
    types: dict[str, str | None] = {}
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        row = event_row(stream, event) if isinstance(event, dict) else None
        for name, value in (row or {}).items():
            if name != operation_field and types.get(name) is None:
                types[name] = infer_type(value, bool(stream.schema_evolution))
    keys = stream.identifier_columns or []
    missing = [key for key in keys if key not in types]
    if stream.schema_evolution:  # a field with no value yet waits for one (schema evolution adds it)
        types = {name: kind for name, kind in types.items() if kind is not None or name in keys}
    if missing or not types:
        raise LakehouseError(
            f"stream {stream.name!r}: cannot infer a schema for {stream.table_identifier} from the first batch: "
            + (
                f"identifier column {missing[0]!r} is in none of its events"
                if missing
                else "no event is a JSON object with a field that has a value"
            )
        )
    return [ColumnSpec(name=name, type=kind or "string", required=name in keys) for name, kind in types.items()]
