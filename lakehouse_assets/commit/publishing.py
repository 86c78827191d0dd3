"""Publish or discard what the audit branch of a ``publish: audit`` table holds beyond main.

Publishing commits the audited batches' dead letters, then points main at the audited snapshot,
only on the table version it checked (so across hosts neither a newer, unchecked audit head nor a
discarded one is published): metadata only, so readers of main see every audited batch at once or
none of them.
The dead-letter table's ancestry says whether its part is done, and the branches say whether the
fast-forward is, so a crash anywhere is completed by publishing again, never repeated.

Discarding points the audit branch back at main and drops the discarded batches' staged Parquet,
so the next committer pass stages them again from their landing files with the configuration of
that time (the fix) and commits them again. Both hold the table's lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyspark.sql import SparkSession

from lakehouse_assets import faults
from lakehouse_assets.batches.ledger import BatchRecord
from lakehouse_assets.catalog.conditional_commits import set_branch_if_unchanged
from lakehouse_assets.commit.branches import AuditState, audit_state, on_main, reset_audit_branch
from lakehouse_assets.commit.dead_letters import commit_dead_letters, stream_dead_letter_identifier
from lakehouse_assets.commit.recovery import MAIN_BRANCH, committed_state
from lakehouse_assets.config.spec import LakehouseConfig, StreamSpec
from lakehouse_assets.errors import ConfigError, DiscardRefusedError, FencedError, PublishRefusedError, TableMovedError
from lakehouse_assets.faults import crash_point
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.locks import exclusive_lock, table_lock_file

# Attempts at publishing when another host changed the table or its dead letters under each one.
PUBLISH_ATTEMPTS = 3


@dataclass(frozen=True)
class PublishResult:
    """What moved main: from which snapshot to which, the batches it published per stream."""

    table: str
    previous_snapshot_id: int | None
    snapshot_id: int
    batch_ranges: dict[str, list[int]]
    dead_letters: int
    publish_latency_seconds: float


@dataclass(frozen=True)
class DiscardResult:
    """The audited snapshot dropped from the audit branch and the batches to be staged again."""

    table: str
    discarded_snapshot_id: int
    main_snapshot_id: int | None
    batch_ranges: dict[str, list[int]]


def _require_audited(config: LakehouseConfig, table_identifier: str) -> list[StreamSpec]:
    if table_identifier not in config.tables:
        raise ConfigError(f"unknown table {table_identifier!r}; configured tables: {', '.join(config.tables)}")
    if not config.audits(table_identifier):
        raise ConfigError(f"{table_identifier} is published directly (publish: direct); it has no audit branch")
    return config.tables[table_identifier]


def _audited_batches(lake: Lakehouse, stream: StreamSpec, first: int, last: int) -> list[BatchRecord]:
    """The batches of an unpublished range with their staged Parquet; PublishRefusedError if gone."""
    records = [r for r in lake.ledger(stream.name).batches(after=first - 1) if r.sequence <= last]
    lost = [r.sequence for r in records if not (r.staged and r.events_path().is_dir())]
    if lost or len(records) != last - first + 1:
        raise PublishRefusedError(
            f"stream {stream.name}: the staged data of audited batches {lost or [first, last]} is gone "
            "(an interrupted discard?); run `lakehouse audit discard` again to stage them anew"
        )
    return records


def _commit_audited_dead_letters(
    spark: SparkSession,
    lake: Lakehouse,
    streams: list[StreamSpec],
    ranges: dict[str, list[int]],
    run_id: str,
) -> int:
    """Commit the dead letters of the unpublished batch ``ranges`` (each stream's part once: its
    dead-letter table's ancestry says); returns how many events they rejected."""
    return sum(
        commit_dead_letters(spark, lake, stream, _audited_batches(lake, stream, *ranges[stream.name]), run_id)
        for stream in streams
        if stream.name in ranges
    )


def publish_table(
    spark: SparkSession,
    lake: Lakehouse,
    table_identifier: str,
    snapshot_id: int,
    run_id: str,
) -> PublishResult | None:
    """Publish the audit branch's head ``snapshot_id`` (the snapshot the checks passed on) to main.

    Returns None when main already has it. Raises PublishRefusedError when the audit branch moved
    on from ``snapshot_id`` (its new head has not been checked) or dropped it (a discard). Main
    moves only from the table version this decided from: when another host changed the table or
    its dead-letter table meanwhile (publishing too, committing, maintaining), it decides again.
    """
    streams = _require_audited(lake.config, table_identifier)
    started = time.monotonic()
    with exclusive_lock(table_lock_file(lake.paths.locks, table_identifier)):
        for _ in range(PUBLISH_ATTEMPTS - 1):
            try:
                return _publish_once(spark, lake, table_identifier, streams, snapshot_id, run_id, started)
            except (FencedError, TableMovedError):
                continue
        return _publish_once(spark, lake, table_identifier, streams, snapshot_id, run_id, started)


def _publish_once(
    spark: SparkSession,
    lake: Lakehouse,
    table_identifier: str,
    streams: list[StreamSpec],
    snapshot_id: int,
    run_id: str,
    started: float,
) -> PublishResult | None:
    """One attempt of ``publish_table``; FencedError or TableMovedError when another host changed
    the dead-letter table or the table after this attempt read them."""
    table = lake.require_table(table_identifier)
    if on_main(table, snapshot_id):
        return None
    state = audit_state(table)
    if not state.awaiting_publish:
        raise PublishRefusedError(
            f"{table_identifier}: snapshot {snapshot_id} is neither awaiting publishing nor on main "
            "(the audited commits were discarded); nothing was published"
        )
    if state.audit != snapshot_id:
        raise PublishRefusedError(
            f"{table_identifier}: the audit branch is at snapshot {state.audit}, not the checked snapshot "
            f"{snapshot_id}; run the checks on the new head first"
        )
    ranges = state.unpublished_ranges()
    dead_letters = _commit_audited_dead_letters(spark, lake, streams, ranges, run_id)
    crash_point(faults.PUBLISH_AFTER_DEAD_LETTERS)
    if not set_branch_if_unchanged(spark, table_identifier, table.metadata_location, MAIN_BRANCH, snapshot_id):
        raise TableMovedError(f"table {table_identifier} changed while its audited snapshot was being published")
    crash_point(faults.PUBLISH_AFTER_FAST_FORWARD)
    return PublishResult(
        table=table_identifier,
        previous_snapshot_id=state.main,
        snapshot_id=snapshot_id,
        batch_ranges=ranges,
        dead_letters=dead_letters,
        publish_latency_seconds=time.monotonic() - started,
    )


def _dead_letters_committed(
    lake: Lakehouse, streams: list[StreamSpec], ranges: dict[str, list[int]]
) -> dict[str, list[int]]:
    """The unpublished ranges whose dead letters a publish already committed (one that did not finish)."""
    begun = {}
    for stream in streams:
        if stream.name in ranges:
            committed = committed_state(lake.table(stream_dead_letter_identifier(stream)), stream.name).sequence
            if committed >= ranges[stream.name][0]:
                begun[stream.name] = ranges[stream.name]
    return begun


def discard_audited(spark: SparkSession, lake: Lakehouse, table_identifier: str) -> DiscardResult | None:
    """Drop the audit branch's unpublished commits and stage their batches again; None when there
    are none. Repeating it after a crash finishes it. Raises DiscardRefusedError when a publish of
    them already committed their dead letters (it must be finished instead), and TableMovedError
    when the table changed while discarding (run it again)."""
    streams = _require_audited(lake.config, table_identifier)
    with exclusive_lock(table_lock_file(lake.paths.locks, table_identifier)):
        table = lake.table(table_identifier)
        state: AuditState = audit_state(table)
        if table is None or not state.awaiting_publish or state.audit is None:
            return None
        ranges = state.unpublished_ranges()
        if begun := _dead_letters_committed(lake, streams, ranges):
            raise DiscardRefusedError(
                f"{table_identifier}: a publish of the audited batches {begun} committed their dead letters and "
                "did not finish; discarding now would keep those dead letters for batches staged again. Finish "
                f"it with `lakehouse audit publish --table {table_identifier}`"
            )
        for stream in streams:
            if stream.name not in ranges:
                continue
            first, last = ranges[stream.name]
            ledger = lake.ledger(stream.name)
            for sequence in range(first, last + 1):
                ledger.forget_staged_data(sequence)
        crash_point(faults.DISCARD_AFTER_UNSTAGING)
        if not reset_audit_branch(spark, table, table_identifier):
            raise TableMovedError(f"{table_identifier} changed while discarding; run the discard again")
    return DiscardResult(table_identifier, state.audit, state.main, ranges)
