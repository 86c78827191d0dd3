"""How staged batches are committed: recover from the ancestry, fence stale committers, publish.

A committer pass over one table:

1. reads the table's current snapshot (its expected base) and takes an epoch one above every
   epoch in the ancestry, then takes the table's OS lock;
2. is fenced (stops without committing) if, under the lock, the table moved from that base or a
   newer committer appears in the ancestry;
3. per stream, reads the highest committed sequence from the current snapshot ancestry (walking
   parents, so a rolled-back batch is committed again), marks staged batches at or below it
   committed without committing them again, and takes the contiguous staged batches above it (a
   missing batch stops the stream with an error naming it);
4. commits their dead letters to the dead-letter table, in a fenced pass over that table of the
   same kind as this one (``commit.fenced_pass``), then publishes their rows: one append for
   all ready batches of an append stream, one commit per batch, in order, for a change stream (a
   row delta through the key index on a format-2 merge-on-read table, else a MERGE).
   Under ``publish: audit`` the rows go to the table's audit branch instead (and only while it
   holds nothing main lacks), and the dead letters wait for the publish (``publishing``).
   Every commit carries the ``lakehouse.*`` summary keys; each table's own ancestry says whether
   its part is already done, so a crash between the two commits is completed, not repeated;
5. decides whether a commit landed only by re-reading the ancestry, whatever the write call
   reported, and retries a conflicting commit itself after re-reading (Iceberg's own retry is off);
6. records the bookkeeping. Staged Parquet is removed by the next pass, under the lock, so this
   pass's checks (which read it holding the lock) can read the batches; a batch whose Parquet is
   gone but which the ancestry no longer holds (a rollback) is staged again from its landing files.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from functools import partial, reduce
from itertools import groupby

from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from lakehouse_assets import faults
from lakehouse_assets.batches.ledger import COMMITTED_FILE, BatchRecord, CommittedBatch, StreamLedger
from lakehouse_assets.batches.staged_rows import accepted_rows, read_staged
from lakehouse_assets.catalog.iceberg_types import parse_type, widens
from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.commit.branches import AuditState, audit_state, sync_audit_branch
from lakehouse_assets.commit.completeness import count_late_events, next_watermark
from lakehouse_assets.commit.dead_letters import commit_dead_letters
from lakehouse_assets.commit.fenced_pass import CommitTarget, CommitterPass, write_until_landed
from lakehouse_assets.commit.pass_branches import (
    abandoned_pass_branches,
    drop_pass_branch,
    uses_pass_branches,
    written_on_pass_branch,
)
from lakehouse_assets.commit.recovery import (
    MAIN_BRANCH,
    branch_head,
    branch_head_id,
    committed_state,
    table_history,
)
from lakehouse_assets.commit.row_deltas import ChangeBatchDelta, uses_row_deltas
from lakehouse_assets.commit.table_columns import (
    add_missing_columns,
    promote_narrower_columns,
    proposed_fields,
    relax_required_columns,
    schema_changes_since_last_snapshot,
    staged_names,
)
from lakehouse_assets.commit.table_writes import (
    ChangeCounts,
    append_rows,
    append_staged_snapshots,
    count_changes,
    merge_changes,
)
from lakehouse_assets.commit.tables import identifier_columns
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.errors import (
    CommitOutcomeUnknownError,
    ConfigError,
    FencedError,
    SequenceGapError,
    TableNotFoundError,
)
from lakehouse_assets.faults import crash_point
from lakehouse_assets.jvm.spark_jvm import copied_session
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.locks import exclusive_lock, table_lock_file

StageAgain = Callable[[SparkSession, Lakehouse, StreamSpec, int, str], object]
"""Stages batch ``sequence`` of ``stream`` again from its landing files, as Parquet, for a pass that
holds the table's lock (``ingest.staging.stage_again``; ``commit`` does not import ``ingest``)."""


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
    end_to_end_seconds: float
    max_event_time: str | None
    watermark: str | None
    late_events: int
    schema_change: dict[str, str]
    epoch: int
    schema_change_batches: dict[str, int] = field(default_factory=dict)
    source_snapshot: str | None = None
    """For an Iceberg source stream: the newest source snapshot this commit applied."""
    stale_changes: int = 0
    """Changes skipped because the row already held a newer one (``StreamSpec.order_column``)."""
    uncoercible_values: dict[str, int] = field(default_factory=dict)
    """Per optional column, the committed events whose value did not coerce to its type (NULL)."""


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
    # Batches the ancestry holds whose bookkeeping a crash cut short, and the open tail after them.
    lacking_bookkeeping = ledger.batches(lacking=COMMITTED_FILE)
    recovered = [r.sequence for r in lacking_bookkeeping if r.sequence <= committed_sequence and not r.committed]
    ready: list[BatchRecord] = []
    waiting_on = None
    expected = committed_sequence + 1
    for record in ledger.batches(after=committed_sequence):
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


def seconds_until_commit_due(table: Table | None, streams: list[StreamSpec], now: float | None = None) -> float:
    """How long the table's next commit must wait for ``commit_interval`` (the shortest of its
    streams') since its current snapshot; 0 when a commit may happen now."""
    current = table.current_snapshot() if table else None
    if current is None:
        return 0.0
    since_commit = (time.time() if now is None else now) - current.timestamp_ms / 1000
    return max(0.0, min(stream.commit_interval for stream in streams) - since_commit)


@dataclass(frozen=True)
class CommitOutcome:
    """What a committer pass found and did."""

    plans: list[CommitPlan]
    results: list[CommitResult]
    fenced: str | None = None
    awaiting_publish: AuditState | None = None
    """Under ``publish: audit``: the audit branch holds commits main does not, so nothing new was committed."""


def _existing(committer: CommitterPass) -> Table:
    """The table as the pass last read it, which exists once the pass writes to it."""
    table = committer.table()
    if table is None:
        raise TableNotFoundError(f"table {committer.table_identifier} does not exist")
    return table


def _has_staged_data(committer: CommitterPass, record: BatchRecord) -> bool:
    """Whether the batch's staged Parquet, and its staged snapshot if it has one, are still there
    (snapshot expiry removes a staged snapshot, and its files, that waited longer than it keeps)."""
    if not record.events_path().is_dir():
        return False
    snapshot_id = record.staged_batch.staged_snapshot
    table = committer.table()
    return snapshot_id is None or (table is not None and table.snapshot_by_id(snapshot_id) is not None)


def _ensure_staged_data(
    committer: CommitterPass, stream: StreamSpec, record: BatchRecord, stage_again: StageAgain
) -> BatchRecord:
    """The batch with its staged data, staging it again with ``stage_again`` (as Parquet: this pass
    holds the table's lock) from its landing files if it is gone."""
    if _has_staged_data(committer, record):
        return record
    ledger = committer.lake.ledger(stream.name)
    ledger.reset_to_minted(record.sequence)
    stage_again(committer.spark, committer.lake, stream, record.sequence, committer.run_id)
    return ledger.require(record.sequence)


def _has_ready_batches(committer: CommitterPass, streams: list[StreamSpec]) -> bool:
    """Whether any stream has a staged batch above what the target's ancestry holds (or a gap,
    which its stream's commit reports)."""
    table = committer.table()
    for stream in streams:
        committed = committed_state(table, stream.name, committer.target.publishes_to).sequence
        try:
            if plan_commit(committer.lake.ledger(stream.name), stream.name, committed).ready:
                return True
        except SequenceGapError:
            return True
    return False


def _evolve_schema(committer: CommitterPass, stream: StreamSpec, batches: list[BatchRecord]) -> None:
    """Add the columns the batches' events brought that the table still lacks, widen those it
    holds in a type too narrow for their values, and make optional the required columns the
    events stopped carrying (``relax_required``; lock held)."""
    proposed: dict[str, str] = {}
    for record in batches:
        for name, kind in proposed_fields(record.staged_batch.new_columns).items():
            # The widest type any batch needs (a later batch may need more decimal digits).
            if name not in proposed or widens(parse_type(proposed[name]), parse_type(kind)):
                proposed[name] = kind
    relaxed = sorted({name for record in batches for name in record.staged_batch.relaxed_columns})
    if not proposed and not relaxed:
        return
    added = add_missing_columns(committer.spark, stream.table_identifier, proposed)
    if added:
        committer.reread()
    schema = _existing(committer).schema()
    promoted = promote_narrower_columns(committer.spark, stream.table_identifier, schema, proposed)
    if relax_required_columns(committer.spark, stream.table_identifier, schema, relaxed) or promoted or added:
        committer.reread()
        crash_point(faults.COMMITTER_AFTER_SCHEMA_CHANGE)


def _triggering_batches(schema_change: dict[str, str], batches: list[BatchRecord]) -> dict[str, int]:
    """For each added column, the first batch of the commit whose events brought it."""
    triggered: dict[str, int] = {}
    for record in batches:
        for name in proposed_fields(record.staged_batch.new_columns):
            if name in schema_change:
                triggered.setdefault(name, record.sequence)
    return triggered


def _record_completeness(committer: CommitterPass, stream: StreamSpec, staged: DataFrame, properties: dict) -> int:
    """Add the stream's new watermark and the batch's late-event count to the commit's summary."""
    if stream.completeness is None:
        return 0
    before = table_history(committer.table(), committer.branch).watermark(stream.name)
    batch_max = properties[summary_keys.MAX_EVENT_TIME] or None
    after = next_watermark(before, batch_max, stream.completeness.allowed_lateness)
    column = stream.resolved_event_time_column()
    if column is None:
        raise ConfigError(f"stream {stream.name!r}: completeness needs a timestamp column")
    late = count_late_events(staged, column, before)
    properties.update({summary_keys.WATERMARK: after or "", summary_keys.LATE_EVENTS: str(late)})
    return late


def _commit_group(committer: CommitterPass, stream: StreamSpec, batches: list[BatchRecord]) -> CommitResult:
    """Publish ``batches`` in one commit (an append; for a change stream a row delta or a MERGE)."""
    identifier = stream.table_identifier
    started = time.monotonic()
    if committer.target.publishes_to == MAIN_BRANCH:
        dead_letters = commit_dead_letters(committer.spark, committer.lake, stream, batches, committer.run_id)
        crash_point(faults.COMMITTER_AFTER_DEAD_LETTERS)
    else:
        # Audited batches send their dead letters when they are published: a discarded batch is
        # staged again, maybe with other rejects, so its first rejects must not be kept.
        dead_letters = sum(record.staged_batch.rejected for record in batches)
    spark = committer.spark
    _evolve_schema(committer, stream, batches)
    keys = identifier_columns(committer.lake, stream)
    staged_snapshots = [s for s in (record.staged_batch.staged_snapshot for record in batches) if s is not None]
    if len(staged_snapshots) == len(batches):
        # Rows written once by the writers: publish their files (``staging.writes_once``).
        counts, properties = _append_summary(committer, stream, batches)
        write = partial(append_staged_snapshots, spark, identifier, staged_snapshots, properties, committer.branch)
        return _publish(committer, stream, batches, write, "append", properties, counts, dead_letters, started)
    table_schema = spark.table(qualified_name(identifier, committer.branch)).schema
    columns = table_schema.fieldNames()
    # Each batch is aligned to the table on its own: batches staged with different new columns, or
    # with different types for one (the first committed type wins), cannot be read as one.
    staged = _staged_rows(spark, batches, table_schema, _existing(committer))
    if keys and uses_row_deltas(_existing(committer)):
        # On a copy of the session: the staged write's setting must reach no other table's commit.
        own = copied_session(spark)
        changes = _staged_rows(own, batches, table_schema, _existing(committer))
        with ChangeBatchDelta(own, committer.lake, identifier, changes, keys, columns, stream.order_column) as delta:
            counts = delta.plan(_existing(committer), committer.expected_snapshot_id)
            properties = _change_summary(committer, stream, batches, counts)
            late_events = _record_completeness(committer, stream, staged, properties)
            write = partial(delta.commit, committer, properties)
            return _publish(
                committer, stream, batches, write, "row_delta", properties, counts, dead_letters, started, late_events
            )
    if keys:
        counts = count_changes(spark, identifier, staged, keys, committer.branch, stream.order_column)
        properties = _change_summary(committer, stream, batches, counts)
        view = f"lakehouse_changes_{stream.name}_{batches[0].sequence}"
        write = partial(
            merge_changes,
            spark,
            identifier,
            staged,
            keys,
            columns,
            properties,
            view,
            committer.branch,
            stream.order_column,
        )
    else:
        counts, properties = _append_summary(committer, stream, batches)
        write = partial(append_rows, staged.select(*columns), identifier, properties, committer.branch)
    late_events = _record_completeness(committer, stream, staged, properties)
    kind = "merge" if keys else "append"
    return _publish(committer, stream, batches, write, kind, properties, counts, dead_letters, started, late_events)


def _staged_rows(spark: SparkSession, batches: list[BatchRecord], table_schema: StructType, table: Table) -> DataFrame:
    """The accepted rows of the staged ``batches`` as the table's columns, with their operation;
    a batch's columns and struct fields that were renamed since it was staged take their new names
    (by field id)."""
    aligned = []
    for record in batches:
        staged = read_staged(spark, record.events_path())
        aligned.append(accepted_rows(staged, table_schema, staged_names(table, record.staged_batch.schema_id)))
    return reduce(DataFrame.unionByName, aligned)


def _change_summary(
    committer: CommitterPass, stream: StreamSpec, batches: list[BatchRecord], counts: ChangeCounts
) -> dict[str, str]:
    """The summary keys of a change batch's commit that has the effect ``counts``."""
    properties = summary_keys.commit_summary(
        stream.name, batches, counts.inserted + counts.updated, counts.inserted - counts.deleted, committer.stamp
    )
    properties.update(
        {
            summary_keys.INSERTED: str(counts.inserted),
            summary_keys.UPDATED: str(counts.updated),
            summary_keys.DELETED: str(counts.deleted),
            summary_keys.STALE_CHANGES: str(counts.stale),
        }
    )
    return properties


def _append_summary(
    committer: CommitterPass, stream: StreamSpec, batches: list[BatchRecord]
) -> tuple[ChangeCounts, dict[str, str]]:
    """What appending ``batches`` inserts, and its commit's summary keys."""
    rows = sum(record.staged_batch.rows for record in batches)
    return ChangeCounts(inserted=rows, updated=0, deleted=0), summary_keys.commit_summary(
        stream.name, batches, rows, rows, committer.stamp
    )


def _publish(
    committer: CommitterPass,
    stream: StreamSpec,
    batches: list[BatchRecord],
    write: Callable[[], None],
    kind: str,
    properties: dict[str, str],
    counts: ChangeCounts,
    dead_letters: int,
    started: float,
    late_events: int = 0,
) -> CommitResult:
    """Run ``write`` (the batches' one commit of ``kind``, carrying ``properties``) until the
    ancestry shows it, record the bookkeeping, and describe the commit."""
    identifier = stream.table_identifier
    rows = counts.inserted + counts.updated
    schema_change = schema_changes_since_last_snapshot(_existing(committer), committer.branch)
    if schema_change:
        properties[summary_keys.SCHEMA_CHANGE] = json.dumps(schema_change)
        properties[summary_keys.SCHEMA_CHANGE_BATCHES] = json.dumps(_triggering_batches(schema_change, batches))
    uncoercible = _uncoercible_values(batches)
    if uncoercible:
        properties[summary_keys.UNCOERCIBLE_VALUES] = json.dumps(uncoercible)
    confirmed = write_until_landed(committer, stream.name, batches[-1].sequence, write)
    crash_point(faults.COMMITTER_AFTER_COMMIT)
    snapshot = branch_head(confirmed, committer.branch)
    if snapshot is None:
        raise CommitOutcomeUnknownError(
            f"table {identifier}: no snapshot after the commit of batch {batches[-1].sequence}"
        )
    committer.expect(snapshot.snapshot_id)
    committed_at = time.time()
    ledger = committer.lake.ledger(stream.name)
    for record in batches:
        ledger.record_committed(
            record.sequence, CommittedBatch(snapshot.snapshot_id, batches[-1].sequence, committed_at)
        )
    summary = snapshot.summary.additional_properties if snapshot.summary else {}
    return CommitResult(
        table=identifier,
        stream=stream.name,
        kind=kind,
        snapshot_id=snapshot.snapshot_id,
        metadata_location=confirmed.metadata_location,
        first_sequence=batches[0].sequence,
        last_sequence=batches[-1].sequence,
        rows=rows,
        inserted=counts.inserted,
        updated=counts.updated,
        deleted=counts.deleted,
        stale_changes=counts.stale,
        dead_letters=dead_letters,
        data_files_added=int(summary.get("added-data-files", "0")),
        delete_files_added=int(summary.get("added-delete-files", "0")),
        commit_latency_seconds=time.monotonic() - started,
        end_to_end_seconds=committed_at - min(record.minted.oldest_landed_at for record in batches),
        max_event_time=properties[summary_keys.MAX_EVENT_TIME] or None,
        watermark=properties.get(summary_keys.WATERMARK) or None,
        late_events=late_events,
        schema_change=schema_change,
        epoch=committer.epoch,
        source_snapshot=properties.get(summary_keys.SOURCE_SNAPSHOT),
        schema_change_batches=json.loads(properties.get(summary_keys.SCHEMA_CHANGE_BATCHES, "{}")),
        uncoercible_values=uncoercible,
    )


def _uncoercible_values(batches: list[BatchRecord]) -> dict[str, int]:
    """Per column, the batches' events whose value was staged as NULL because it did not coerce."""
    totals: dict[str, int] = {}
    for record in batches:
        for column, count in record.staged_batch.uncoercible_values.items():
            totals[column] = totals.get(column, 0) + count
    return dict(sorted(totals.items()))


def _commit_stream(
    committer: CommitterPass,
    stream: StreamSpec,
    plans: list[CommitPlan],
    results: list[CommitResult],
    publish_waits: bool,
    stage_again: StageAgain,
) -> None:
    """Mark what the branch already holds committed, then (unless publishing waits) commit the
    ready batches, staging again with ``stage_again`` those whose staged data is gone."""
    ledger = committer.lake.ledger(stream.name)
    history = table_history(committer.table(), committer.branch)
    plan = plan_commit(ledger, stream.name, history.sequence(stream.name))
    plans.append(plan)
    for sequence in plan.recovered:
        # The commit that holds the batch (checks read each batch on its own snapshot); the
        # checkpoint's snapshot when that commit has expired.
        holder = next(
            (c for c in history.commits if c.stream == stream.name and c.first_sequence <= sequence <= c.last_sequence),
            None,
        )
        if holder:
            committed = CommittedBatch(holder.snapshot_id, holder.last_sequence, time.time())
        else:
            committed = CommittedBatch(history.base.snapshot_id if history.base else 0, sequence, time.time())
        ledger.record_committed(sequence, committed)
    if publish_waits:
        return
    # Appends fold every ready batch into one commit. Changes commit one batch at a time, in order:
    # folding them would need the net effect across batches, and a per-batch commit keeps each
    # batch's deletes and upserts checkable on its own snapshot.
    ready = [_ensure_staged_data(committer, stream, record, stage_again) for record in plan.ready]
    if stream.applies_changes:
        groups = [[record] for record in ready]
    else:
        # Batches written once into staged snapshots and batches staged as Parquet publish by
        # different writes: each run of consecutive batches of one kind is one commit.
        runs = groupby(ready, key=lambda record: record.staged_batch.staged_snapshot is None)
        groups = [list(group) for _, group in runs]
    for group in groups:
        results.append(_commit_group(committer, stream, group))


def _remove_published_attempts(ledger: StreamLedger, published_sequence: int) -> None:
    """Staged Parquet of batches that main holds, committed by earlier passes; the last pass's
    stays for its checks, and batches waiting on the audit branch keep theirs until published."""
    for record in ledger.batches(with_attempts=True):
        if (
            record.committed
            and record.staged
            and record.sequence <= published_sequence
            and record.events_path().is_dir()
        ):
            ledger.remove_attempts(record.sequence)
            crash_point(faults.COMMITTER_DURING_CLEANUP)


def _prepare_audit_branch(committer: CommitterPass) -> AuditState | None:
    """Under ``publish: audit`` (lock held, fence checked): the audit branch created or brought up
    to main, and its state; None for a table published directly or not created yet."""
    table = committer.table()
    if committer.branch == MAIN_BRANCH or table is None:
        return None
    if sync_audit_branch(committer.spark, table, committer.table_identifier):
        # This pass moved the branch itself, holding the lock: its new head is the expected base.
        table = committer.reread()
        committer.expect(branch_head_id(table, committer.branch))
    return audit_state(table)


def commit_pass(
    spark: SparkSession,
    lake: Lakehouse,
    table_identifier: str,
    run_id: str,
    stage_again: StageAgain,
) -> CommitOutcome:
    """Commit every stream's ready batches to one table (to its audit branch under ``publish:
    audit``, and only while that branch holds nothing unpublished), unless fenced by another
    committer; a ready batch whose staged data is gone is staged again with ``stage_again``."""
    streams = lake.config.tables[table_identifier]
    target = CommitTarget.audited() if lake.config.audits(table_identifier) else CommitTarget.direct()
    committer = CommitterPass.begin(spark, lake, table_identifier, run_id, target)
    crash_point(faults.COMMITTER_BEFORE_LOCK)
    plans: list[CommitPlan] = []
    results: list[CommitResult] = []
    with exclusive_lock(table_lock_file(lake.paths.locks, table_identifier)):
        # Under the lock: the checks of another run read staged Parquet holding the same lock.
        main = committer.reread()
        for stream in streams:
            published = committed_state(main, stream.name).sequence
            _remove_published_attempts(lake.ledger(stream.name), published)
        for name in abandoned_pass_branches(main):
            drop_pass_branch(spark, table_identifier, name)
        writing = committer
        try:
            committer.check_fence()
            audit = _prepare_audit_branch(committer)
            publish_waits = bool(audit and audit.awaiting_publish)
            fenced_by_catalog = (
                uses_pass_branches(lake.config) and not publish_waits and _has_ready_batches(committer, streams)
            )
            through = (
                written_on_pass_branch(
                    spark,
                    lake.config,
                    table_identifier,
                    committer.expected_snapshot_id,
                    target.publishes_to,
                    committer.stamp,
                )
                if fenced_by_catalog
                else nullcontext(target.branch)
            )
            with through as branch:
                writing = committer.on_pass_branch(branch) if branch != target.branch else committer
                for stream in streams:
                    _commit_stream(writing, stream, plans, results, publish_waits, stage_again)
        except FencedError as fenced:
            # On a pass branch nothing was published; on the target itself, what landed before the fence was.
            return CommitOutcome(plans, [] if writing.target.is_pass_branch else results, fenced=str(fenced))
        if uses_pass_branches(lake.config):
            location = lake.require_table(table_identifier).metadata_location
            results = [replace(result, metadata_location=location) for result in results]
    return CommitOutcome(plans, results, awaiting_publish=audit if audit and audit.awaiting_publish else None)
