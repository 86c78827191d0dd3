"""How a batch is staged: read exactly its landing files, convert, write Parquet invisibly.

Staged data lives beside the ledger, never in the table, so readers see nothing until the
committer publishes it. Each attempt writes into its own directory and the first attempt to
record itself wins, so a retried or duplicated writer run leaves exactly one staged batch. Spark
reads the landing files through links named by position (``inputs/``), so a file's name is never
a pattern or a path to Hadoop. Should the conversion job still fail on some events, they are
isolated and staged as dead letters with Spark's error (``quarantine``), and the rest is staged.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakehouse_assets import faults
from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.catalog.tables import ensure_table, identifier_columns
from lakehouse_assets.config import ColumnSpec, StreamSpec
from lakehouse_assets.errors import ConfigError, LakehouseError
from lakehouse_assets.faults import crash_point
from lakehouse_assets.ingest.batch_ledger import EVENTS_DIR, BatchRecord, StagedBatch, StreamLedger
from lakehouse_assets.ingest.conversion import convert_events, read_landing_lines, staged_events, with_iceberg_types
from lakehouse_assets.ingest.inference import SAMPLE_EVENTS, infer_columns
from lakehouse_assets.ingest.landing import landing_dir
from lakehouse_assets.ingest.quarantine import SPARK_ERRORS, isolate_failing_lines, quarantined_events, without_failing
from lakehouse_assets.ingest.schema_evolution import new_columns, with_new_columns
from lakehouse_assets.ingest.staged_format import DELETE, EVENT_COLUMN, OPERATION_COLUMN, REASON_COLUMN
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.source.iceberg_source import source_columns

# Event times in the ledger and in snapshot summaries: ISO 8601 in UTC (the session time zone), so
# they compare correctly as strings.
ISO_8601_UTC = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"
INPUT_LINKS_DIR = "inputs"


@dataclass(frozen=True)
class StagingOutcome:
    """The staged batch and whether this call wrote it (False: an earlier attempt had)."""

    staged: StagedBatch
    written_now: bool
    files: int
    bytes: int


def minted_record(
    ledger: StreamLedger, stream: StreamSpec, sequence: int, expected_files: list[str] | None
) -> BatchRecord:
    """The ledger record of a minted batch; LakehouseError when it was never minted or when
    ``expected_files`` (what a run was asked to stage) differ from its files."""
    record = ledger.batch(sequence)
    if record is None:
        raise LakehouseError(f"stream {stream.name!r}: batch {sequence} was never minted")
    if expected_files is not None and list(expected_files) != list(record.minted.files):
        raise LakehouseError(
            f"stream {stream.name!r}: batch {sequence} holds {len(record.minted.files)} files in the ledger, "
            f"but the run asked for {len(expected_files)} different files"
        )
    return record


def input_links(record: BatchRecord) -> Path:
    """Where Spark reads the batch's landing files from: links named by position (``inputs/``)."""
    return record.directory / INPUT_LINKS_DIR


def landing_files(paths: LakehousePaths, stream: StreamSpec, record: BatchRecord) -> list[str]:
    """The batch's landing files; LakehouseError when one has disappeared."""
    directory = landing_dir(paths, stream)
    missing = [name for name in record.minted.files if not (directory / name).is_file()]
    if missing:
        raise LakehouseError(
            f"stream {stream.name!r}: batch {record.sequence} lost {len(missing)} landing files, "
            f"e.g. {directory / missing[0]}; landing files must never be removed before commit"
        )
    return [str(directory / name) for name in record.minted.files]


def batch_figures(stream: StreamSpec, table_schema: T.StructType) -> list[Column]:
    """The figures the ledger records of a staged batch, as aggregates over its staged rows: rows,
    deletes, rejected events and the event-time range."""
    accepted = F.col(REASON_COLUMN).isNull()
    deleted = accepted & (F.col(OPERATION_COLUMN) == F.lit(DELETE))
    event_time = stream.resolved_event_time_column()
    if event_time not in table_schema.fieldNames():
        event_time = None
    event_times = F.when(accepted & ~deleted, F.col(event_time)) if event_time else F.lit(None).cast("timestamp")
    return [
        F.count(F.when(accepted & ~deleted, 1)).alias("rows"),
        F.count(F.when(deleted, 1)).alias("deletes"),
        F.count(F.when(~accepted, 1)).alias("rejected"),
        F.date_format(F.min(event_times), ISO_8601_UTC).alias("min_event_time"),
        F.date_format(F.max(event_times), ISO_8601_UTC).alias("max_event_time"),
    ]


def _write_observed(
    staged: DataFrame, stream: StreamSpec, table_schema: T.StructType, sequence: int, attempt_dir: Path
) -> dict:
    """Write the staged events as the attempt's Parquet in one pass, observing the batch's figures
    while writing."""
    observation = Observation(f"batch-{sequence}")
    staged.observe(observation, *batch_figures(stream, table_schema)).write.parquet(str(attempt_dir / EVENTS_DIR))
    return observation.get


@dataclass(frozen=True)
class StagingSchema:
    """What a batch is converted to: the table's columns (with Iceberg types, plus the columns the
    batch adds), its identifier columns, and the columns added (name -> type)."""

    table_schema: T.StructType
    identifier_columns: list[str]
    added: dict[str, str]


def staging_schema(
    spark: SparkSession,
    lake: Lakehouse,
    stream: StreamSpec,
    undeclared_columns: Callable[[], list[ColumnSpec]],
    lines: DataFrame | None = None,
) -> StagingSchema:
    """Create the stream's table if it is missing (from ``undeclared_columns()`` when nothing is
    declared) and read what the batch converts to; with schema evolution, ``lines`` may add columns.
    Raises ConfigError when ``version_column`` is not a column of the table."""
    ensure_table(spark, lake, stream, undeclared_columns)
    table_schema = with_iceberg_types(
        spark.table(qualified_name(stream.table_identifier)).schema,
        lake.table(stream.table_identifier).schema(),
    )
    added = new_columns(lines, stream, table_schema) if stream.schema_evolution and lines is not None else {}
    table_schema = with_new_columns(table_schema, added)
    if stream.version_column and stream.version_column not in table_schema.fieldNames():
        raise ConfigError(
            f"stream {stream.name!r}: version_column: {stream.version_column!r} is not a column of "
            f"{stream.table_identifier} (columns: {', '.join(table_schema.fieldNames())})"
        )
    return StagingSchema(table_schema, identifier_columns(lake, stream), added)


def stage_batch(
    spark: SparkSession,
    lake: Lakehouse,
    stream: StreamSpec,
    sequence: int,
    expected_files: list[str] | None = None,
    run_id: str | None = None,
) -> StagingOutcome:
    """Stage batch ``sequence`` of ``stream``; harmless to repeat.

    Raises LakehouseError when the batch was never minted, when ``expected_files`` differ from the
    minted files, or when a landing file has disappeared.
    """
    ledger = lake.ledger(stream.name)
    record = minted_record(ledger, stream, sequence, expected_files)
    minted = record.minted
    if record.staged:
        return StagingOutcome(record.staged, False, len(minted.files), minted.bytes)

    lines = read_landing_lines(spark, landing_files(lake.paths, stream, record), input_links(record))
    # Called only when the table must be created without declared columns.
    if stream.iceberg_source:
        undeclared_columns = partial(source_columns, lake, stream)
    else:
        sample = lines.select(EVENT_COLUMN).limit(SAMPLE_EVENTS)
        undeclared_columns = lambda: infer_columns(stream, [row[0] for row in sample.collect()])  # noqa: E731
    schema = staging_schema(spark, lake, stream, undeclared_columns, lines)
    table_schema, keys, added = schema.table_schema, schema.identifier_columns, schema.added

    def converted(subset: DataFrame) -> DataFrame:
        return staged_events(convert_events(subset, table_schema, stream, keys), table_schema, keys)

    attempt, attempt_dir = ledger.new_attempt(sequence)
    try:
        metrics = _write_observed(converted(lines), stream, table_schema, sequence, attempt_dir)
    except SPARK_ERRORS:
        # The safety net: find the events Spark fails on, dead-letter them, stage the rest.
        failing = isolate_failing_lines(
            lines, lambda span: converted(span).write.format("noop").mode("overwrite").save()
        )
        if not failing:
            raise
        shutil.rmtree(attempt_dir, ignore_errors=True)
        attempt, attempt_dir = ledger.new_attempt(sequence)
        quarantined = quarantined_events(lines, failing, table_schema)
        frame = converted(without_failing(lines, failing)).unionByName(quarantined)
        metrics = _write_observed(frame, stream, table_schema, sequence, attempt_dir)
    crash_point(faults.WRITER_AFTER_STAGING)
    return record_attempt(ledger, record, attempt, metrics, run_id, added)


def record_attempt(
    ledger: StreamLedger,
    record: BatchRecord,
    attempt: str,
    figures: dict,
    run_id: str | None,
    added: dict[str, str],
) -> StagingOutcome:
    """Record a written attempt (``figures`` from ``batch_figures``) as the batch's staged data
    unless another attempt won first; the losing attempts' files are removed."""
    staged = StagedBatch(
        sequence=record.sequence,
        attempt=attempt,
        rows=figures["rows"],
        deletes=figures["deletes"],
        rejected=figures["rejected"],
        min_event_time=figures["min_event_time"],
        max_event_time=figures["max_event_time"],
        staged_at=time.time(),
        run_id=run_id,
        new_columns=added,
    )
    minted = record.minted
    if ledger.record_staged(staged):
        crash_point(faults.WRITER_AFTER_RECORDING)
        return StagingOutcome(staged, True, len(minted.files), minted.bytes)
    winner = ledger.batch(record.sequence)
    ledger.remove_attempts(record.sequence, keep=winner.staged.attempt)
    return StagingOutcome(winner.staged, False, len(minted.files), minted.bytes)
