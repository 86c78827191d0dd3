"""How a batch is staged: read exactly its landing files, convert, write Parquet invisibly.

Staged data lives beside the ledger, never in the table, so readers see nothing until the
committer publishes it. Each attempt writes into its own directory and the first attempt to
record itself wins, so a retried or duplicated writer run leaves exactly one staged batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from lakehouse_assets.batch_ledger import StagedBatch, StreamLedger
from lakehouse_assets.config import LakehouseConfig, StreamSpec
from lakehouse_assets.conversion import accepted_rows, convert_events, rejected_events
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.landing import landing_dir
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.tables import ensure_table, qualified_name


@dataclass(frozen=True)
class StagingOutcome:
    """The staged batch and whether this call wrote it (False: an earlier attempt had)."""

    staged: StagedBatch
    written_now: bool
    files: int
    bytes: int


def _isoformat(value: object) -> str | None:
    return value.isoformat() if value is not None else None


def stage_batch(
    spark: SparkSession,
    config: LakehouseConfig,
    paths: LakehousePaths,
    stream: StreamSpec,
    sequence: int,
    expected_files: list[str] | None = None,
    run_id: str | None = None,
) -> StagingOutcome:
    """Stage batch ``sequence`` of ``stream``; harmless to repeat.

    Raises LakehouseError when the batch was never minted, when ``expected_files`` differ from the
    minted files, or when a landing file has disappeared.
    """
    ledger = StreamLedger(paths.staging(stream.name))
    record = ledger.batch(sequence)
    if record is None:
        raise LakehouseError(f"stream {stream.name!r}: batch {sequence} was never minted")
    minted = record.minted
    if expected_files is not None and list(expected_files) != list(minted.files):
        raise LakehouseError(
            f"stream {stream.name!r}: batch {sequence} holds {len(minted.files)} files in the ledger, "
            f"but the run asked for {len(expected_files)} different files"
        )
    if record.staged:
        return StagingOutcome(record.staged, False, len(minted.files), minted.bytes)

    directory = landing_dir(paths, stream)
    missing = [name for name in minted.files if not (directory / name).is_file()]
    if missing:
        raise LakehouseError(
            f"stream {stream.name!r}: batch {sequence} lost {len(missing)} landing files, "
            f"e.g. {directory / missing[0]}; landing files must never be removed before commit"
        )
    ensure_table(spark, config, paths, stream)
    table_schema = spark.table(qualified_name(stream.table_identifier)).schema

    attempt, attempt_dir = ledger.new_attempt(sequence)
    lines = spark.read.text([str(directory / name) for name in minted.files])
    converted = convert_events(lines, table_schema).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        accepted_rows(converted, table_schema).write.parquet(str(attempt_dir / "rows"))
        rejected_events(converted).write.parquet(str(attempt_dir / "rejects"))
    finally:
        converted.unpersist()

    staged_rows = spark.read.parquet(str(attempt_dir / "rows"))
    event_time_column = stream.resolved_event_time_column()
    min_time = max_time = None
    if event_time_column and event_time_column in staged_rows.columns:
        bounds = staged_rows.agg(F.min(event_time_column), F.max(event_time_column)).first()
        min_time, max_time = bounds[0], bounds[1]
    staged = StagedBatch(
        sequence=sequence,
        attempt=attempt,
        rows=staged_rows.count(),
        rejected=spark.read.parquet(str(attempt_dir / "rejects")).count(),
        min_event_time=_isoformat(min_time),
        max_event_time=_isoformat(max_time),
        staged_at=time.time(),
        run_id=run_id,
    )
    if ledger.record_staged(staged):
        return StagingOutcome(staged, True, len(minted.files), minted.bytes)
    winner = ledger.batch(sequence)
    ledger.remove_attempts(sequence, keep=winner.staged.attempt)
    return StagingOutcome(winner.staged, False, len(minted.files), minted.bytes)
