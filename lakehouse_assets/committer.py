"""How staged batches are committed: recover from the ancestry, then one append per target table.

Protocol, per stream of a table, holding the table's commit lock:

1. read the highest committed sequence from the table's current snapshot ancestry;
2. mark staged batches at or below it committed (a crash after an earlier commit), without
   committing them again;
3. take the contiguous run of staged batches above it (a missing batch stops the run, loudly);
4. append their dead letters to the dead-letter table, then publish their rows to the table: one
   append for all ready batches of an append stream, one MERGE per batch (in order) for a change
   stream; every commit carries the ``lakehouse.*`` summary keys, and each table's own ancestry
   says whether its part is already done, so a crash between the two commits is repaired by the
   next run;
5. re-read the ancestry to confirm the commit and record the bookkeeping. Staged Parquet is
   removed by the next committer run, so the checks of this run can still read the batches.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import partial, reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakehouse_assets import summary_keys
from lakehouse_assets.batch_ledger import BatchRecord, CommittedBatch, StreamLedger
from lakehouse_assets.config import LakehouseConfig, StreamSpec
from lakehouse_assets.conversion import accepted_rows, rejected_events
from lakehouse_assets.errors import CommitOutcomeUnknownError, SequenceGapError
from lakehouse_assets.locks import exclusive_lock, table_lock_file
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.recovery import committed_state
from lakehouse_assets.table_metadata import (
    current_metadata_location,
    load_committed_table,
)
from lakehouse_assets.table_writes import ChangeCounts, append_rows, count_changes, merge_changes
from lakehouse_assets.tables import MANAGED_TABLE_PROPERTIES, identifier_columns, qualified_name

DEAD_LETTER_SUFFIX = "_dead_letters"


def dead_letter_identifier(table_identifier: str) -> str:
    """The dead-letter table that sits next to a table: ``<namespace>.<table>_dead_letters``."""
    return f"{table_identifier}{DEAD_LETTER_SUFFIX}"


@dataclass(frozen=True)
class CommitResult:
    """What one commit published, for metadata, logs and checks."""

    table: str
    stream: str
    kind: str
    snapshot_id: int
    metadata_location: str
    first_sequence: int
    last_sequence: int
    rows: int
    inserted: int
    updated: int
    deleted: int
    dead_letters: int
    data_files_added: int
    delete_files_added: int
    commit_latency_seconds: float
    lag_seconds: float
    max_event_time: str | None
    epoch: int


@dataclass(frozen=True)
class CommitPlan:
    """What a committer pass found for one stream before committing anything."""

    stream: str
    committed_sequence: int
    ready: list[BatchRecord]
    recovered: list[int] = field(default_factory=list)
    waiting_on: str | None = None


def plan_commit(ledger: StreamLedger, stream: str, committed_sequence: int) -> CommitPlan:
    """Which staged batches come next, in order, given what the ancestry says is committed."""
    records = ledger.batches()
    recovered = [r.sequence for r in records if r.sequence <= committed_sequence and not r.committed]
    ready: list[BatchRecord] = []
    waiting_on = None
    expected = committed_sequence + 1
    for record in (r for r in records if r.sequence > committed_sequence):
        if record.sequence != expected:
            raise SequenceGapError(
                f"stream {stream!r}: batch {expected} is missing from the staging ledger but batch "
                f"{record.sequence} exists; later batches cannot commit until {expected} is restored"
            )
        if record.staged is None:
            waiting_on = f"batch {record.sequence} is minted but not staged yet"
            break
        ready.append(record)
        expected += 1
    return CommitPlan(stream, committed_sequence, ready, recovered, waiting_on)


def _summary_properties(
    stream: StreamSpec, batches: list[BatchRecord], rows: int, net_rows: int, epoch: int, run_id: str
) -> dict[str, str]:
    files = [name for record in batches for name in record.minted.files]
    event_times = [r.staged.max_event_time for r in batches if r.staged.max_event_time]
    return {
        summary_keys.STREAM: stream.name,
        summary_keys.COMMIT_SEQUENCE: str(batches[-1].sequence),
        summary_keys.BATCH_RANGE: summary_keys.format_batch_range(batches[0].sequence, batches[-1].sequence),
        summary_keys.ROWS: str(rows),
        summary_keys.NET_ROWS: str(net_rows),
        summary_keys.SOURCE_OFFSETS: json.dumps({"files": len(files), "first": files[0], "last": files[-1]}),
        summary_keys.MAX_EVENT_TIME: max(event_times) if event_times else "",
        summary_keys.COMMITTER_EPOCH: str(epoch),
        summary_keys.COMMITTER_RUN: run_id,
    }


def _ensure_dead_letter_table(spark: SparkSession, identifier: str) -> None:
    properties = ", ".join(f"'{k}' = '{v}'" for k, v in {"format-version": "2", **MANAGED_TABLE_PROPERTIES}.items())
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {qualified_name(identifier)} ("
        "event string, reason string, stream string, batch_sequence bigint, source_file string, "
        f"source_line bigint, recorded_at timestamp) USING iceberg TBLPROPERTIES ({properties})"
    )


def _commit_dead_letters(
    spark: SparkSession,
    config: LakehouseConfig,
    paths: LakehousePaths,
    stream: StreamSpec,
    batches: list[BatchRecord],
    epoch: int,
    run_id: str,
) -> int:
    """Append the batches' rejected events to the dead-letter table, unless its ancestry has them."""
    identifier = dead_letter_identifier(stream.table_identifier)
    count = sum(record.staged.rejected for record in batches)
    if count == 0:
        return 0
    _ensure_dead_letter_table(spark, identifier)
    already = committed_state(load_committed_table(config, paths, identifier), stream.name).sequence
    pending = [record for record in batches if record.sequence > already and record.staged.rejected]
    if not pending:
        return count
    frames = [
        rejected_events(spark.read.parquet(str(record.events_path()))).select(
            "event",
            "reason",
            F.lit(stream.name).alias("stream"),
            F.lit(record.sequence).cast("bigint").alias("batch_sequence"),
            "source_file",
            "source_line",
            F.current_timestamp().alias("recorded_at"),
        )
        for record in pending
    ]
    rows = sum(record.staged.rejected for record in pending)
    properties = _summary_properties(stream, pending, rows, rows, epoch, run_id)
    append_rows(reduce(DataFrame.unionByName, frames), identifier, properties)
    return count


def _commit_group(
    spark: SparkSession,
    config: LakehouseConfig,
    paths: LakehousePaths,
    stream: StreamSpec,
    batches: list[BatchRecord],
    epoch: int,
    run_id: str,
) -> CommitResult:
    """Publish ``batches`` in one commit (an append, or one MERGE for a change stream)."""
    identifier = stream.table_identifier
    started = time.monotonic()
    dead_letters = _commit_dead_letters(spark, config, paths, stream, batches, epoch, run_id)
    columns = spark.table(qualified_name(identifier)).columns
    staged = accepted_rows(spark.read.parquet(*[str(record.events_path()) for record in batches]), columns)
    keys = identifier_columns(config, paths, stream)
    if keys:
        counts = count_changes(spark, identifier, staged, keys)
        rows = counts.inserted + counts.updated
        properties = _summary_properties(stream, batches, rows, counts.inserted - counts.deleted, epoch, run_id)
        properties.update(
            {
                summary_keys.INSERTED: str(counts.inserted),
                summary_keys.UPDATED: str(counts.updated),
                summary_keys.DELETED: str(counts.deleted),
            }
        )
        view = f"lakehouse_changes_{stream.name}_{batches[0].sequence}"
        write = partial(merge_changes, spark, identifier, staged, keys, columns, properties, view)
    else:
        rows = sum(record.staged.rows for record in batches)
        counts = ChangeCounts(inserted=rows, updated=0, deleted=0)
        properties = _summary_properties(stream, batches, rows, rows, epoch, run_id)
        write = partial(append_rows, staged.select(*columns), identifier, properties)
    write_error: Exception | None = None
    try:
        write()
    except Exception as error:  # noqa: BLE001 - py4j errors of any kind; the ancestry decides below
        write_error = error
    # Whatever the write reported, only the ancestry says whether the commit landed.
    confirmed = load_committed_table(config, paths, identifier)
    if committed_state(confirmed, stream.name).sequence < batches[-1].sequence:
        if write_error is not None:
            raise write_error
        raise CommitOutcomeUnknownError(
            f"table {identifier}: the commit of batches {properties[summary_keys.BATCH_RANGE]} "
            "returned but the ancestry does not show it; staged data is kept for the next run"
        )
    snapshot = confirmed.current_snapshot()
    committed_at = time.time()
    ledger = StreamLedger(paths.staging(stream.name))
    for record in batches:
        ledger.record_committed(
            record.sequence, CommittedBatch(snapshot.snapshot_id, batches[-1].sequence, committed_at)
        )
    summary = snapshot.summary.additional_properties
    return CommitResult(
        table=identifier,
        stream=stream.name,
        kind="merge" if keys else "append",
        snapshot_id=snapshot.snapshot_id,
        metadata_location=current_metadata_location(config, paths, identifier),
        first_sequence=batches[0].sequence,
        last_sequence=batches[-1].sequence,
        rows=rows,
        inserted=counts.inserted,
        updated=counts.updated,
        deleted=counts.deleted,
        dead_letters=dead_letters,
        data_files_added=int(summary.get("added-data-files", "0")),
        delete_files_added=int(summary.get("added-delete-files", "0")),
        commit_latency_seconds=time.monotonic() - started,
        lag_seconds=committed_at - min(record.minted.oldest_landed_at for record in batches),
        max_event_time=properties[summary_keys.MAX_EVENT_TIME] or None,
        epoch=epoch,
    )


def _commit_stream(
    spark: SparkSession,
    config: LakehouseConfig,
    paths: LakehousePaths,
    stream: StreamSpec,
    epoch: int,
    run_id: str,
) -> tuple[CommitPlan, list[CommitResult]]:
    ledger = StreamLedger(paths.staging(stream.name))
    table = load_committed_table(config, paths, stream.table_identifier)
    state = committed_state(table, stream.name)
    plan = plan_commit(ledger, stream.name, state.sequence)
    for sequence in plan.recovered:
        ledger.record_committed(sequence, CommittedBatch(state.snapshot_id or 0, state.sequence, time.time()))
    if not plan.ready:
        return plan, []
    # Appends fold every ready batch into one commit. Changes commit one batch at a time, in order:
    # folding them would need the net effect across batches, and a per-batch commit keeps each
    # batch's deletes and upserts checkable on its own snapshot.
    groups = [[record] for record in plan.ready] if stream.applies_changes else [plan.ready]
    return plan, [_commit_group(spark, config, paths, stream, group, epoch, run_id) for group in groups]


def _remove_published_attempts(ledger: StreamLedger) -> None:
    """Staged Parquet of batches committed by earlier runs; the last run's stays for its checks."""
    for record in ledger.batches():
        if record.committed:
            ledger.remove_attempts(record.sequence)


def next_epoch(config: LakehouseConfig, paths: LakehousePaths, table_identifier: str) -> int:
    """A committer's epoch: one more than the newest epoch in the table's ancestry."""
    table = load_committed_table(config, paths, table_identifier)
    return committed_state(table, "").epoch + 1


def commit_table(
    spark: SparkSession,
    config: LakehouseConfig,
    paths: LakehousePaths,
    table_identifier: str,
    run_id: str,
) -> tuple[list[CommitPlan], list[CommitResult]]:
    """Commit every stream's ready batches to one table; returns the plans and the commits made."""
    streams = config.tables()[table_identifier]
    for stream in streams:
        _remove_published_attempts(StreamLedger(paths.staging(stream.name)))
    plans, results = [], []
    with exclusive_lock(table_lock_file(paths.locks, table_identifier)):
        epoch = next_epoch(config, paths, table_identifier)
        for stream in streams:
            plan, stream_results = _commit_stream(spark, config, paths, stream, epoch, run_id)
            plans.append(plan)
            results.extend(stream_results)
    return plans, results
