"""How a batch is staged: read exactly its landing files, convert, write invisibly.

Readers see nothing until the committer publishes a batch. Most batches are staged as Parquet
beside the ledger. A plain append batch on the embedded (Hadoop) catalog writes its rows once,
straight into the table's files, under a staged snapshot that no branch references (Iceberg's
write-audit-publish: ``write.wap.enabled`` and ``spark.wap.id``); the committer then publishes
those same files, and only the rejected events are staged as Parquet (found again from the
landing lines; the rows are read by Spark's JSON file reader when it reads every line alike,
``parsed_lines``). Each attempt writes into its own directory (and its own staged snapshot) and
the first attempt to record itself wins, so a retried or duplicated writer run leaves exactly one
staged batch; a losing staged snapshot is never published, and snapshot expiry removes its files.
Spark reads the landing files through links named by position (``inputs/``), so a file's name is
never a pattern or a path to Hadoop. Should the conversion job still fail on some events, they are
isolated and staged as dead letters with Spark's error (``quarantine``), and the rest is staged as
Parquet.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakehouse_assets import faults
from lakehouse_assets.batches.headroom import commit_bytes
from lakehouse_assets.batches.landing import landing_dir
from lakehouse_assets.batches.ledger import EVENTS_DIR, BatchRecord, StagedBatch, StreamLedger
from lakehouse_assets.batches.staged_format import (
    DELETE,
    EVENT_COLUMN,
    OPERATION_COLUMN,
    REASON_COLUMN,
    UNCOERCIBLE_COLUMN,
)
from lakehouse_assets.catalog.staged_snapshots import allow_staged_snapshots, staged_snapshot_id, write_staged
from lakehouse_assets.catalog.table_metadata import is_hadoop_catalog, qualified_name
from lakehouse_assets.commit.tables import ensure_table, identifier_columns
from lakehouse_assets.config.spec import ColumnSpec, StreamSpec
from lakehouse_assets.errors import ConfigError, LakehouseError
from lakehouse_assets.faults import crash_point
from lakehouse_assets.ingest.conversion import (
    convert_events,
    convert_parsed_events,
    row_fields,
    uncoercible_paths,
    with_iceberg_types,
)
from lakehouse_assets.ingest.inference import SAMPLE_EVENTS, infer_columns
from lakehouse_assets.ingest.kafka_reader import read_kafka_lines
from lakehouse_assets.ingest.landing_reader import read_landing_lines
from lakehouse_assets.ingest.parsed_lines import read_parsed_events
from lakehouse_assets.ingest.quarantine import SPARK_ERRORS, isolate_failing_lines, quarantined_events, without_failing
from lakehouse_assets.ingest.schema_evolution import (
    columns_needed,
    required_columns_missing,
    with_columns,
    with_optional,
)
from lakehouse_assets.ingest.staged_events import staged_events
from lakehouse_assets.jvm.column_cache import Named, cached_columns, named
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.locks import exclusive_lock, table_lock_file
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.source.iceberg_source import source_columns
from lakehouse_assets.source.kafka_log import KafkaLog, lost_offsets, records_lost_error
from lakehouse_assets.storage_space import refused_write, require_free_bytes

# Event times in the ledger and in snapshot summaries: ISO 8601 in UTC (the session time zone), so
# they compare correctly as strings.
ISO_8601_UTC = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"
INPUT_LINKS_DIR = "inputs"


@dataclass(frozen=True)
class StagingOutcome:
    """The staged batch and whether this call wrote it (False: an earlier attempt had)."""

    staged: StagedBatch
    written_now: bool
    files: tuple[str, ...]
    """The batch's landing files."""
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


def kafka_lost_offsets(stream: StreamSpec, record: BatchRecord) -> dict[str, list[int]]:
    """The offsets of a Kafka batch the log deleted before it was read: none, or the lost ranges
    with ``on_records_lost: skip``; KafkaRecordsLostError naming them otherwise."""
    lost = lost_offsets(record.minted.offsets, KafkaLog(stream).partitions())
    skips = stream.kafka_source is not None and stream.kafka_source.on_records_lost == "skip"
    if lost and not skips:
        raise records_lost_error(stream, record.sequence, lost)
    return lost


def batch_figures(stream: StreamSpec, table_schema: T.StructType) -> list[Column]:
    """The figures the ledger records of a staged batch, as aggregates over its staged rows: rows,
    deletes, rejected events, the event-time range, and per optional column the accepted events
    whose value for it could not be coerced (``uncoercible``; a struct's fields by their path)."""
    return named(_figures(stream, table_schema))


@cached_columns
def _figures(stream: StreamSpec, table_schema: T.StructType) -> Named:
    accepted = F.col(REASON_COLUMN).isNull()
    deleted = accepted & (F.col(OPERATION_COLUMN) == F.lit(DELETE))
    event_time = stream.resolved_event_time_column()
    if event_time not in table_schema.fieldNames():
        event_time = None
    event_times = F.when(accepted & ~deleted, F.col(event_time)) if event_time else F.lit(None).cast("timestamp")
    return (
        ("rows", F.count(F.when(accepted & ~deleted, 1))),
        ("deletes", F.count(F.when(deleted, 1))),
        ("rejected", F.count(F.when(~accepted, 1))),
        ("min_event_time", F.date_format(F.min(event_times), ISO_8601_UTC)),
        ("max_event_time", F.date_format(F.max(event_times), ISO_8601_UTC)),
        ("uncoercible", _uncoercible_counts(uncoercible_paths(table_schema.fields), accepted)),
    )


def _uncoercible_counts(optional_columns: list[str], accepted: Column) -> Column:
    """A JSON object from each column that may not coerce to the accepted events whose value for it
    did not (text: an observation hands back only primitive values as Python's)."""
    if not optional_columns:
        return F.lit("{}")
    uncoercible = F.col(UNCOERCIBLE_COLUMN)
    counts = [F.count(F.when(accepted & F.array_contains(uncoercible, name), 1)) for name in optional_columns]
    return F.to_json(F.map_from_arrays(F.array(*[F.lit(name) for name in optional_columns]), F.array(*counts)))


def _write_observed(
    staged: DataFrame, stream: StreamSpec, table_schema: T.StructType, sequence: int, attempt_dir: Path
) -> dict:
    """Write the staged events as the attempt's Parquet in one pass, observing the batch's figures
    while writing."""
    observation = Observation(f"batch-{sequence}")
    staged.observe(observation, *batch_figures(stream, table_schema)).write.parquet(str(attempt_dir / EVENTS_DIR))
    return observation.get


def writes_once(lake: Lakehouse, stream: StreamSpec, identifier_columns: list[str], added: dict[str, str]) -> bool:
    """Whether the batch's rows go straight into a staged snapshot of the table: a plain append
    (no keys, no columns added, no watermark to compute from the rows, no audit branch, not an
    Iceberg source) on the embedded Hadoop catalog, whose table lock covers every committer. On a
    catalog shared by hosts, the staged snapshot's commit could conflict with another host's
    commit, and Iceberg's own retry is off on our tables, so those batches stage Parquet."""
    return (
        is_hadoop_catalog(lake.config.catalog)
        and not identifier_columns
        and not added
        and not stream.applies_changes
        and not stream.schema_evolution
        and stream.completeness is None
        and not stream.iceberg_source
        and not stream.kafka_source
        and not lake.config.audits(stream.table_identifier)
    )


def _write_once(
    spark: SparkSession,
    lake: Lakehouse,
    stream: StreamSpec,
    converted: DataFrame,
    rejected: Callable[[], DataFrame],
    table_schema: T.StructType,
    sequence: int,
    attempt: str,
    attempt_dir: Path,
) -> tuple[dict, int]:
    """Write the accepted rows of ``converted`` (the batch's converted events) into a staged
    snapshot of the table, observing the batch's figures while writing, then ``rejected()`` (the
    staged rejected events, if any) as the attempt's Parquet. Returns the figures and the staged
    snapshot's id.

    The rows keep the job's own partitioning (no shuffle: each task writes a file per table
    partition it meets), which is what makes one write cheaper than two. Rejected events are
    rare; finding them again costs a second conversion, only for a batch that has them.
    """
    identifier = stream.table_identifier
    wap_id = f"{stream.name}:{sequence}:{attempt}"
    observation = Observation(f"batch-{sequence}")
    accepted = converted.observe(observation, *batch_figures(stream, table_schema)).where(F.col(REASON_COLUMN).isNull())
    # The staged snapshot is a metadata commit: on the Hadoop catalog only the table lock keeps it
    # from racing another commit to the same metadata version.
    with exclusive_lock(table_lock_file(lake.paths.locks, identifier)):
        allow_staged_snapshots(spark, lake.require_table(identifier), identifier)
        write_staged(accepted.select(*[F.col(f"`{name}`") for name in table_schema.fieldNames()]), identifier, wap_id)
    figures = observation.get
    events = attempt_dir / EVENTS_DIR
    if figures["rejected"]:
        rejected().write.parquet(str(events))
    else:
        events.mkdir(parents=True)
    return figures, staged_snapshot_id(lake.table(identifier), identifier, wap_id)


@dataclass(frozen=True)
class StagingSchema:
    """What a batch is converted to: the table's columns (with Iceberg types, plus the columns the
    batch adds or promotes), its identifier columns, the columns added or promoted (name -> type),
    and the id of the table's schema it was read from (the committer maps the staged columns'
    names through it by field id, should an operator rename one in the meantime)."""

    table_schema: T.StructType
    identifier_columns: list[str]
    added: dict[str, str]
    schema_id: int
    relaxed: list[str]
    """Required columns the batch's events stop carrying, staged as optional (``relax_required``)."""


def staging_schema(
    spark: SparkSession,
    lake: Lakehouse,
    stream: StreamSpec,
    undeclared_columns: Callable[[], list[ColumnSpec]],
    lines: DataFrame | None = None,
) -> StagingSchema:
    """Create the stream's table if it is missing (from ``undeclared_columns()`` when nothing is
    declared) and read what the batch converts to; with schema evolution, ``lines`` may add or
    promote columns.
    Raises ConfigError when ``version_column`` is not a column of the table."""
    ensure_table(spark, lake, stream, undeclared_columns)
    iceberg_schema = lake.require_table(stream.table_identifier).schema()
    table_schema = with_iceberg_types(spark.table(qualified_name(stream.table_identifier)).schema, iceberg_schema)
    keys = identifier_columns(lake, stream)
    added = columns_needed(lines, stream, table_schema) if stream.schema_evolution and lines is not None else {}
    relaxed = (
        required_columns_missing(lines, stream, table_schema, keys)
        if stream.relaxes_required and lines is not None
        else []
    )
    table_schema = with_optional(with_columns(table_schema, added), relaxed)
    if stream.version_column and stream.version_column not in table_schema.fieldNames():
        raise ConfigError(
            f"stream {stream.name!r}: version_column: {stream.version_column!r} is not a column of "
            f"{stream.table_identifier} (columns: {', '.join(table_schema.fieldNames())})"
        )
    return StagingSchema(table_schema, keys, added, iceberg_schema.schema_id, relaxed)


def stage_batch(
    spark: SparkSession,
    lake: Lakehouse,
    stream: StreamSpec,
    sequence: int,
    expected_files: list[str] | None = None,
    run_id: str | None = None,
    into_table: bool = True,
) -> StagingOutcome:
    """Stage batch ``sequence`` of ``stream``; harmless to repeat. With ``into_table`` (and
    ``writes_once``), the rows go into a staged snapshot of the table, taking the table's lock;
    a caller that holds it (the committer staging a batch again) passes False.

    Raises LakehouseError when the batch was never minted, when ``expected_files`` differ from the
    minted files, or when a landing file has disappeared.
    """
    ledger = lake.ledger(stream.name)
    record = minted_record(ledger, stream, sequence, expected_files)
    minted = record.minted
    if record.staged:
        return StagingOutcome(record.staged, False, tuple(minted.files), minted.bytes)
    # The batch's Parquet, staged or the table's own, takes about this much room (``headroom``):
    # a full disk stops the batch here, before any write of it, not in the middle of one.
    require_free_bytes(ledger.root, commit_bytes(minted.bytes), f"staging batch {sequence} of {stream.name}")

    files = landing_files(lake.paths, stream, record)
    lost = kafka_lost_offsets(stream, record) if stream.kafka_source else {}

    @cache
    def lines() -> DataFrame:
        # Planned only when needed: a batch the JSON file reader reads, with no rejected events,
        # never needs its lines' text.
        if not stream.kafka_source:
            return read_landing_lines(spark, files, input_links(record))
        ranges = {name: [lost.get(name, [start, start])[1], end] for name, (start, end) in minted.offsets.items()}
        crash_point(faults.KAFKA_BEFORE_READ)
        records = read_kafka_lines(spark, stream, ranges)
        # Dead letters replayed into the stream, as landing files beside the offsets.
        return records.unionByName(read_landing_lines(spark, files, input_links(record))) if files else records

    # Called only when the table must be created without declared columns.
    undeclared_columns: Callable[[], list[ColumnSpec]]
    if stream.iceberg_source:
        undeclared_columns = partial(source_columns, lake, stream)
    else:
        undeclared_columns = lambda: infer_columns(  # noqa: E731
            stream, [row[0] for row in lines().select(EVENT_COLUMN).limit(SAMPLE_EVENTS).collect()]
        )
    schema = staging_schema(spark, lake, stream, undeclared_columns, lines() if stream.schema_evolution else None)
    table_schema, keys, added = schema.table_schema, schema.identifier_columns, schema.added

    def converted(subset: DataFrame) -> DataFrame:
        return staged_events(convert_events(subset, table_schema, stream, keys), table_schema, keys)

    attempt, attempt_dir = ledger.new_attempt(sequence)
    staged_snapshot = None
    crash_point(faults.WRITER_BEFORE_WRITE)
    try:
        if into_table and writes_once(lake, stream, keys, added):
            # Its rows are parsed by Spark's JSON file reader when it reads every line alike.
            parsed = read_parsed_events(spark, files, input_links(record), row_fields(table_schema))
            rows = converted(lines()) if parsed is None else convert_parsed_events(parsed, table_schema, stream)
            rejected = lambda: converted(lines()).where(F.col(REASON_COLUMN).isNotNull())  # noqa: E731
            metrics, staged_snapshot = _write_once(
                spark, lake, stream, rows, rejected, table_schema, sequence, attempt, attempt_dir
            )
        else:
            metrics = _write_observed(converted(lines()), stream, table_schema, sequence, attempt_dir)
    except SPARK_ERRORS as error:
        if refused_write(error):
            # A file system that refuses writes fails every event alike: nothing to isolate.
            shutil.rmtree(attempt_dir, ignore_errors=True)
            raise
        # The safety net: find the events Spark fails on, dead-letter them, stage the rest.
        failing = isolate_failing_lines(
            lines(), lambda span: converted(span).write.format("noop").mode("overwrite").save()
        )
        if not failing:
            raise
        shutil.rmtree(attempt_dir, ignore_errors=True)
        attempt, attempt_dir = ledger.new_attempt(sequence)
        quarantined = quarantined_events(lines(), failing, table_schema)
        frame = converted(without_failing(lines(), failing)).unionByName(quarantined)
        metrics = _write_observed(frame, stream, table_schema, sequence, attempt_dir)
    crash_point(faults.WRITER_AFTER_STAGING)
    return record_attempt(ledger, record, attempt, metrics, run_id, schema, staged_snapshot, lost)


def record_attempt(
    ledger: StreamLedger,
    record: BatchRecord,
    attempt: str,
    figures: dict,
    run_id: str | None,
    schema: StagingSchema,
    staged_snapshot: int | None = None,
    lost_offsets: dict[str, list[int]] | None = None,
) -> StagingOutcome:
    """Record a written attempt (``figures`` from ``batch_figures``, its rows in the staged
    Parquet or in ``staged_snapshot``) as the batch's staged data unless another attempt won
    first; the losing attempts' files are removed (a losing staged snapshot's by expiry)."""
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
        new_columns=schema.added,
        relaxed_columns=schema.relaxed,
        schema_id=schema.schema_id,
        uncoercible_values={name: count for name, count in json.loads(figures["uncoercible"]).items() if count},
        staged_snapshot=staged_snapshot,
        lost_offsets=lost_offsets or {},
    )
    minted = record.minted
    if ledger.record_staged(staged):
        crash_point(faults.WRITER_AFTER_RECORDING)
        return StagingOutcome(staged, True, tuple(minted.files), minted.bytes)
    winner = ledger.require(record.sequence).staged_batch
    ledger.remove_attempts(record.sequence, keep=winner.attempt)
    return StagingOutcome(winner, False, tuple(minted.files), minted.bytes)


def stage_again(spark: SparkSession, lake: Lakehouse, stream: StreamSpec, sequence: int, run_id: str) -> None:
    """Stage batch ``sequence`` again from its landing files, as Parquet, for a committer pass that
    holds the table's lock and found its staged data gone (``commit.committer.StageAgain``)."""
    stage_batch(spark, lake, stream, sequence, run_id=run_id, into_table=False)
