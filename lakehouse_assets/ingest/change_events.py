"""How change events are read: the operation of each event, Debezium envelopes, source order, and
the collapse of a batch's changes per key to their net effect.

Operation names map case-insensitively as in the sink RFC: ``index, insert, create, c, i, r`` ->
INSERT (``r`` is Debezium's snapshot read), ``update, u`` -> UPDATE, ``delete, d`` -> DELETE;
anything else is a dead letter.

Net effect per key, in source order, is simply the key's last change: a last DELETE deletes
(insert-then-delete leaves nothing, and deleting a missing key does nothing), a last INSERT or
UPDATE upserts its row (delete-then-insert upserts the new row, several updates keep the last, an
update of a missing key inserts it). So the MERGE never meets two source rows for one key, and
replaying a batch gives the same table.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from lakehouse_assets.batches.staged_format import DELETE, OPERATION_BY_NAME, UPSERT
from lakehouse_assets.config.spec import OPERATION_POINTER, StreamSpec
from lakehouse_assets.jvm.column_cache import cached_columns

SOURCE_POSITION_FIELDS = ("lsn", "file", "pos", "row")
_RANK = "_lakehouse_rank"


@dataclass(frozen=True)
class EventShape:
    """Where an event's row, operation and source position are, as Spark columns over its text."""

    row: Column
    raw_operation: Column
    position: list[Column]
    source_position: Column | None = None
    """A Debezium change's source position (``SOURCE_POSITION_TYPE``), kept with its row."""

    @property
    def operation(self) -> Column:
        """INSERT, UPDATE or DELETE; NULL for an unrecognized or missing operation."""
        normalized = F.lower(F.trim(self.raw_operation))
        mapped = F.lit(None).cast("string")
        for name, operation in OPERATION_BY_NAME.items():
            mapped = F.when(normalized == name, F.lit(operation)).otherwise(mapped)
        return mapped


def _json_path(pointer: str) -> str:
    """``/a/b`` -> ``$.a.b`` (pointers are validated to plain field names at load)."""
    return "$" + pointer.replace("/", ".")


def _debezium_field(event: Column, name: str) -> Column:
    # Debezium's JSON converter wraps the change in "payload" when schemas are enabled.
    return F.coalesce(F.get_json_object(event, f"$.payload.{name}"), F.get_json_object(event, f"$.{name}"))


def event_shape(stream: StreamSpec, event: Column, landing_position: list[Column]) -> EventShape:
    """The shape of the stream's events: plain rows, rows with an operation, or Debezium envelopes."""
    if stream.is_debezium:
        raw_operation = _debezium_field(event, "op")
        is_delete = F.lower(F.trim(raw_operation)) == F.lit("d")
        row = F.when(is_delete, _debezium_field(event, "before")).otherwise(_debezium_field(event, "after"))
        source_position = [
            _debezium_field(event, "source.lsn").cast("decimal(38,0)"),
            _debezium_field(event, "source.file"),
            _debezium_field(event, "source.pos").cast("decimal(38,0)"),
            _debezium_field(event, "source.row").cast("long"),
        ]
        named = zip(source_position, SOURCE_POSITION_FIELDS, strict=True)
        kept = F.struct(*[value.alias(name) for value, name in named])
        return EventShape(row, raw_operation, source_position + landing_position, kept)
    if stream.operation is None:
        return EventShape(event, F.lit("insert"), landing_position)
    match = OPERATION_POINTER.fullmatch(stream.operation)
    if match:
        pointer = stream.operation[2:-1]
        return EventShape(event, F.get_json_object(event, _json_path(pointer)), landing_position)
    return EventShape(event, F.lit(stream.operation), landing_position)


def collapse_changes(
    frame: DataFrame, identifier_columns: list[str], operation: str, position: str, reason: str
) -> DataFrame:
    """Keep, per key, only the last accepted change (``reason`` NULL) in source order; rejected
    rows are all kept.

    ``operation`` becomes UPSERT or DELETE (the net effect) on the kept rows.
    """
    rank, kept, net_operation = _collapse_columns(identifier_columns, operation, position, reason)
    ranked = frame.withColumn(_RANK, rank)
    return ranked.where(kept).drop(_RANK).withColumn(operation, net_operation)


@cached_columns
def _collapse_columns(
    identifier_columns: list[str], operation: str, position: str, reason: str
) -> tuple[Column, Column, Column]:
    """:func:`collapse_changes`' rank of a change among its key's, which changes it keeps, and
    their net operation."""
    accepted = F.col(reason).isNull()
    keys = [F.col(f"`{name}`") for name in identifier_columns]
    latest_first = Window.partitionBy(*keys, accepted).orderBy(F.col(position).desc())
    net_operation = (
        F.when(~accepted, F.col(operation)).when(F.col(operation) == DELETE, F.lit(DELETE)).otherwise(F.lit(UPSERT))
    )
    return F.row_number().over(latest_first), ~accepted | (F.col(_RANK) == 1), net_operation
