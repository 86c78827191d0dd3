"""Read a Kafka batch's offset ranges with Spark's Kafka batch source, as the lines staging reads.

Each record becomes one line as a landing file's would be: its value's text (UTF-8 as produced;
invalid bytes are kept as they are, then replaced like a landed line's), ``<topic>/<partition>`` as
its source file and its offset as its line, so conversion, dead letters, checks and replays treat
it like any event. Records are read ``read_committed``: an aborted transaction's records and the
transactions' markers are skipped, so offsets in a batch need not be dense (compacted topics too).

A record with no value (a tombstone) is a dead letter ``not a JSON object`` on a JSON stream, and
is skipped on a Debezium stream, where it only follows a delete for log compaction. The record's
metadata the stream keeps (``source.kafka.metadata_columns``) is added to its JSON object as
fields, last, so they win over fields of the same name in the value.
"""

from __future__ import annotations

import json

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from lakehouse_assets.batches.staged_format import EVENT_COLUMN, LINE_COLUMN, SOURCE_FILE_COLUMN
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.engine.local_rows import rows_frame
from lakehouse_assets.source.kafka_log import spark_options, split_partition_name

_VALUE = "_lakehouse_value"
KAFKA_FORMAT = "kafka"


def _offsets_json(ranges: dict[str, list[int]], index: int) -> str:
    """Spark's ``startingOffsets``/``endingOffsets`` JSON: ``{"topic": {"partition": offset}}``."""
    by_topic: dict[str, dict[str, int]] = {}
    for name, bounds in ranges.items():
        topic, partition = split_partition_name(name)
        by_topic.setdefault(topic, {})[str(partition)] = bounds[index]
    return json.dumps(by_topic)


def _metadata(field: str) -> Column:
    """A record's metadata field as the value the event gets."""
    if field == "key":
        return F.col("key").cast("string")
    if field == "headers":
        pairs = F.transform(F.col("headers"), lambda h: F.struct(h["key"], h["value"].cast("string")))
        return F.when(F.col("headers").isNotNull(), F.map_from_entries(pairs))
    return F.col(field)


def _metadata_fields(stream: StreamSpec) -> Column | None:
    """The kept metadata of a record as a JSON object's text, or None when the stream keeps none."""
    columns = stream.kafka_source.metadata_columns if stream.kafka_source else {}
    if not columns:
        return None
    kept = [_metadata(field).alias(name) for name, field in columns.items()]
    return F.to_json(F.struct(*kept), {"ignoreNullFields": "false"})


def _with_fields(value: Column, fields: Column) -> Column:
    """``value`` (a record's text) with the members of ``fields`` (a JSON object's text) added at
    the end of its object; a value that is no JSON object is left as it is (a dead letter)."""
    text = F.expr(f"btrim({_VALUE}, ' \\t\\r\\n')")
    is_object = text.startswith("{") & text.endswith("}")
    empty = text.rlike(r"^\{[ \t\r\n]*\}$")
    members = fields.substr(F.lit(2), F.length(fields))
    merged = F.concat(text.substr(F.lit(1), F.length(text) - 1), F.lit(","), members)
    return F.when(empty, fields).when(is_object, merged).otherwise(value)


def read_kafka_lines(spark: SparkSession, stream: StreamSpec, ranges: dict[str, list[int]]) -> DataFrame:
    """One row per committed record in ``ranges`` (``[start, end)`` per ``<topic>/<partition>``):
    its event text, ``<topic>/<partition>`` and offset, as ``landing_reader.read_landing_lines``
    gives a landing file's lines."""
    reading = {name: bounds for name, bounds in ranges.items() if bounds[1] > bounds[0]}
    if not reading:  # a batch of replayed dead letters only
        schema = f"{EVENT_COLUMN} string, {SOURCE_FILE_COLUMN} string, {LINE_COLUMN} long"
        return rows_frame(spark, [], schema)
    assigned: dict[str, list[int]] = {}
    for name in reading:
        topic, partition = split_partition_name(name)
        assigned.setdefault(topic, []).append(partition)
    records = (
        spark.read.format(KAFKA_FORMAT)
        .options(**spark_options(stream))
        .option("assign", json.dumps({topic: sorted(partitions) for topic, partitions in assigned.items()}))
        .option("startingOffsets", _offsets_json(reading, 0))
        .option("endingOffsets", _offsets_json(reading, 1))
        .option("failOnDataLoss", "true")
        .option("includeHeaders", "true")
        .load()
    )
    if stream.is_debezium:
        records = records.where(F.col("value").isNotNull())
    value = F.coalesce(F.col("value").cast("string"), F.lit("null"))
    fields = _metadata_fields(stream)
    event = F.col(_VALUE) if fields is None else _with_fields(F.col(_VALUE), fields)
    return records.select("*", value.alias(_VALUE)).select(
        event.alias(EVENT_COLUMN),
        F.concat(F.col("topic"), F.lit("/"), F.col("partition").cast("string")).alias(SOURCE_FILE_COLUMN),
        F.col("offset").alias(LINE_COLUMN),
    )
