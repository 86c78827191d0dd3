"""How a table's committer pass shows in Dagster, the one way for every run that commits (a commit
group's committer, single or routed, a router's run for tables new to the loaded definitions, and
the audited table's publish): ``report_commit``. Its commits become materializations of the table
with Dagster's standard table metadata, its checks evaluations on the snapshot it committed, what
each stream waits on goes to the log with the days it completed, and a failure is the table's in
``CommitFailures``."""

from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

import dagster as dg
from pyiceberg.table import Table

from lakehouse_assets.catalog.table_metadata import CATALOG_NAME
from lakehouse_assets.commit.branches import AuditState
from lakehouse_assets.commit.committer import CommitOutcome, CommitResult
from lakehouse_assets.commit.completeness import complete_days, table_watermark
from lakehouse_assets.commit.dead_letters import dead_letter_identifier
from lakehouse_assets.commit.publishing import PublishResult
from lakehouse_assets.commit.recovery import AUDIT_BRANCH, table_history
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.check_status import failed_checks
from lakehouse_assets.defs.checks import CheckTarget, TableCheck
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.errors import SequenceGapError, describe_error
from lakehouse_assets.quality import checks
from lakehouse_assets.quality.lag import stream_lag_seconds
from lakehouse_assets.quality.table_stats import table_stats


def commit_metadata(result: CommitResult) -> dict[str, Any]:
    """Numeric metadata Dagster plots per commit, plus the snapshot the checks must read."""
    latency = result.commit_latency_seconds
    return {
        "snapshot_id": str(result.snapshot_id),
        "metadata_location": result.metadata_location,
        "stream": result.stream,
        "commit_sequence": result.last_sequence,
        "batch_range": f"{result.first_sequence}-{result.last_sequence}",
        "commit_kind": result.kind,
        "rows": result.rows,
        "rows_inserted": result.inserted,
        "rows_updated": result.updated,
        "rows_deleted": result.deleted,
        "stale_changes_skipped": result.stale_changes,
        "dead_letters": result.dead_letters,
        "uncoercible_values": dg.JsonMetadataValue(result.uncoercible_values),
        "data_files_added": result.data_files_added,
        "delete_files_added": result.delete_files_added,
        "commit_latency_seconds": round(latency, 3),
        "rows_per_second": round(result.rows / latency, 1) if latency > 0 else 0.0,
        "end_to_end_seconds": round(result.end_to_end_seconds, 3),
        "max_event_time": result.max_event_time or "",
        "watermark": result.watermark or "",
        "late_events": result.late_events,
        "schema_change": dg.JsonMetadataValue(result.schema_change),
        "schema_change_batches": dg.JsonMetadataValue(result.schema_change_batches),
        "committer_epoch": result.epoch,
        "dead_letter_table": dead_letter_identifier(result.table),
    } | ({"source_snapshot": result.source_snapshot} if result.source_snapshot else {})


def run_ranges(outcome: CommitOutcome) -> dict[str, list[int]]:
    """Per stream, the first and last batch this pass committed (what the run-level checks read)."""
    ranges: dict[str, list[int]] = {}
    for result in outcome.results:
        first, last = ranges.get(result.stream, [result.first_sequence, result.last_sequence])
        ranges[result.stream] = [min(first, result.first_sequence), max(last, result.last_sequence)]
    return ranges


def _signal_complete_days(
    context: dg.AssetExecutionContext, table_identifier: str, streams: list[StreamSpec], table: Table | None
) -> None:
    """Report every complete day not reported yet (a crash before reporting is caught up next run)."""
    tracked = [stream for stream in streams if stream.completeness]
    if not tracked:
        return
    key = names.complete_days_key(table_identifier)
    watermark = table_watermark(table_history(table), tracked)
    reported = context.instance.get_materialized_partitions(key)
    first = min(stream.completeness.start_date for stream in tracked if stream.completeness)
    if reported:
        first = max(first, date.fromisoformat(max(reported)) + timedelta(days=1))
    for day in complete_days(first, watermark):
        metadata = {"watermark": watermark}
        context.log_event(dg.AssetMaterialization(key, partition=day.isoformat(), metadata=metadata))


class CommitFailures:
    """The tables of a step that failed, with why; the step fails at the end naming them all."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.first_error: Exception | None = None

    def add(self, table: str, reason: object, error: Exception | None = None) -> None:
        self.reasons.append(f"{table}: {reason}")
        self.first_error = self.first_error or error

    def raise_any(self) -> None:
        if not self.reasons:
            return
        summary = "; ".join(self.reasons)
        if len(self.reasons) > 1:
            summary = f"{len(self.reasons)} tables failed: {summary}"
        raise dg.Failure(summary) from self.first_error


def report_commit(
    context: dg.AssetExecutionContext,
    lakehouse: LakehouseResource,
    table: str,
    streams: list[StreamSpec],
    table_checks: list[TableCheck],
    outcome: CommitOutcome | PublishResult | Exception,
    failures: CommitFailures,
) -> Iterator[dg.MaterializeResult]:
    """Report one table's committer pass: yields the materialization of its last commit (or of the
    audited snapshot it reports again), logs the commits before it, and evaluates the table's
    checks on what it reports (but those the run has a step for). A publish (main moved to the
    audited snapshot, whose checks passed before) yields the materialization of the table's
    published asset. A failed commit, a sequence gap or a failed blocking check goes to
    ``failures``. A run whose own asset is not the table (a router's run) logs the yielded result
    as an ``AssetMaterialization``."""
    key = names.table_key(table)
    if isinstance(outcome, SequenceGapError):
        # A gap must be loud: it fails the run, and the sequence check where the UI shows it.
        context.log_event(
            dg.AssetCheckEvaluation(
                asset_key=key, check_name=names.SEQUENCE_CHECK, passed=False, metadata={"found": str(outcome)}
            )
        )
        failures.add(table, outcome, outcome)
        return
    if isinstance(outcome, Exception):
        context.log.error(f"{table}: commit failed: {describe_error(outcome)}")
        failures.add(table, outcome, outcome)
        return
    if isinstance(outcome, PublishResult):
        yield _published(context, lakehouse, table, streams, outcome)
        return
    _log_commit_pass(context, lakehouse, table, streams, outcome)
    if outcome.awaiting_publish:
        reported = _awaiting_publish(context, lakehouse, table, streams, outcome.awaiting_publish)
    else:
        reported = _committed(context, lakehouse, table, streams, outcome)
    if reported is None:
        return
    materialization, target = reported
    yield materialization
    _evaluate_checks(context, lakehouse, table, table_checks, target, failures)


def _log_commit_pass(
    context: dg.AssetExecutionContext,
    lakehouse: LakehouseResource,
    table_identifier: str,
    streams: list[StreamSpec],
    outcome: CommitOutcome,
) -> None:
    """Log what each stream of a committer pass waits on, and report the days the pass completed."""
    for plan in outcome.plans:
        if plan.recovered:
            context.log.info(
                f"{table_identifier}: stream {plan.stream}: batches {plan.recovered} were already in the table; "
                "marked committed"
            )
        if plan.waiting_on:
            context.log.info(f"{table_identifier}: stream {plan.stream}: {plan.waiting_on}")
    if outcome.fenced:
        context.log.warning(outcome.fenced)
    lake = lakehouse.lake()
    table = lake.table(table_identifier)
    _signal_complete_days(context, table_identifier, [lake.stream(s.name) for s in streams], table)


def _committed(
    context: dg.AssetExecutionContext,
    lakehouse: LakehouseResource,
    table_identifier: str,
    streams: list[StreamSpec],
    outcome: CommitOutcome,
) -> tuple[dg.MaterializeResult, CheckTarget] | None:
    """Every commit of the pass but the last logged as a materialization of the table; the last
    one's, with the table's figures after it and each stream's backlog, and what its checks read:
    the snapshot it committed and the batches the pass published (None: it committed nothing)."""
    if not outcome.results:
        context.log.info(f"{table_identifier}: nothing committed; the table is unchanged")
        return None
    lake = lakehouse.lake()
    table = lake.table(table_identifier)
    after: dict[str, Any] = table_stats(table) | {
        f"lag_seconds.{stream.name}": round(stream_lag_seconds(lake.paths, stream, table), 3) for stream in streams
    }
    for result in outcome.results[:-1]:
        context.log_event(dg.AssetMaterialization(names.table_key(table_identifier), metadata=commit_metadata(result)))
    if lake.config.audits(table_identifier):
        after["branch"] = AUDIT_BRANCH
    last = outcome.results[-1]
    metadata = (
        commit_metadata(last)
        | after
        | {names.RUN_RANGES_METADATA: dg.JsonMetadataValue(run_ranges(outcome))}
        | standard_table_metadata(table_identifier, table, streams)
    )
    snapshot = checks.CommittedSnapshot(last.metadata_location, last.snapshot_id, lake.file_io_properties)
    target = CheckTarget(snapshot, run_ranges(outcome))
    return dg.MaterializeResult(asset_key=names.table_key(table_identifier), metadata=metadata), target


def _awaiting_publish(
    context: dg.AssetExecutionContext,
    lakehouse: LakehouseResource,
    table_identifier: str,
    streams: list[StreamSpec],
    state: AuditState,
) -> tuple[dg.MaterializeResult, CheckTarget] | None:
    """The audit branch holds commits main does not. When a check failed on them, publishing stays
    stopped until the user acts (None); otherwise (a run died before its checks or its publish)
    the audited snapshot is reported again, with what its checks read, so they run and it is published."""
    audited = state.audit
    if audited is None:  # never while commits await publishing
        return None
    failed = failed_checks(context.instance, table_identifier, streams, audited)
    ranges = state.unpublished_ranges()
    if failed:
        context.log.warning(
            f"{table_identifier}: publishing stopped at audited snapshot {audited} (batches {ranges}): "
            + "; ".join(f"{name} {found}" for name, found in failed.items())
            + f". Later batches stay staged. Fix, then run job {names.publish_job_name(table_identifier)} "
            f"(or `lakehouse audit publish --table {table_identifier}`), or discard the audited batches with "
            f"`lakehouse audit discard --table {table_identifier}`"
        )
        return None
    context.log.info(f"{table_identifier}: audited snapshot {audited} is not published yet; checking it again")
    table = lakehouse.lake().require_table(table_identifier)
    location = table.metadata_location
    metadata = {
        "snapshot_id": str(audited),
        "metadata_location": location,
        "branch": AUDIT_BRANCH,
        "reported_again": True,
        names.RUN_RANGES_METADATA: dg.JsonMetadataValue(ranges),
    } | standard_table_metadata(table_identifier, table, streams)
    target = CheckTarget(checks.CommittedSnapshot(location, audited, lakehouse.lake().file_io_properties), ranges)
    return dg.MaterializeResult(asset_key=names.table_key(table_identifier), metadata=metadata), target


def _published(
    context: dg.AssetExecutionContext,
    lakehouse: LakehouseResource,
    table_identifier: str,
    streams: list[StreamSpec],
    result: PublishResult,
) -> dg.MaterializeResult:
    """Main moved to the audited snapshot: the published asset's materialization, with what moved
    it and the table's figures as main has them."""
    context.log.info(
        f"{table_identifier}: main moved from {result.previous_snapshot_id} to {result.snapshot_id} "
        f"(batches {result.batch_ranges})"
    )
    main = lakehouse.lake().table(table_identifier)
    metadata = {
        "snapshot_id": str(result.snapshot_id),
        "previous_snapshot_id": str(result.previous_snapshot_id or ""),
        "published_batches": dg.JsonMetadataValue(result.batch_ranges),
        "dead_letters": result.dead_letters,
        "publish_latency_seconds": round(result.publish_latency_seconds, 3),
    } | standard_table_metadata(table_identifier, main, streams)
    return dg.MaterializeResult(asset_key=names.published_key(table_identifier), metadata=metadata)


def _evaluate_checks(
    context: dg.AssetExecutionContext,
    lakehouse: LakehouseResource,
    table: str,
    table_checks: list[TableCheck],
    target: CheckTarget,
    failures: CommitFailures,
) -> None:
    """Log the table's checks on ``target``, but those the run has a step for (the UI's
    materialize with checks selects them: that step evaluates them on this materialization). A
    committing run does not plan them: planning a check is an event per check and table at run
    creation, which for hundreds of tables cost more than the checks; and the run evaluates only
    those of the tables it committed, each on the snapshot it committed."""
    key = names.table_key(table)
    # Going around Dagster here: it has no public way to ask which checks a run's job plans. Inside
    # the run, the subset job the UI's materialize runs has them in its asset graph only (its
    # ``asset_check_selection`` and the run's are None there); test_checks.py fails if that changes.
    planned = context.job_def.asset_layer.asset_graph.asset_check_keys
    for check in table_checks:
        if dg.AssetCheckKey(key, check.name) in planned:
            continue
        result = check.result(key, lakehouse, target)
        context.log_event(
            dg.AssetCheckEvaluation(
                asset_key=key,
                check_name=check.name,
                passed=result.passed,
                metadata=result.metadata,
                severity=result.severity,
                description=result.description,
            )
        )
        if check.blocking and not result.passed:
            failures.add(table, f"check {check.name} failed: {result.description}")


def standard_table_metadata(table_identifier: str, table: Table | None, streams: list[StreamSpec]) -> dict:
    """Dagster's standard table metadata of the table as ``table`` has it (none without a table):
    live rows (records less position deletes; the pipeline writes no equality deletes), the
    columns with their Iceberg types (the streams' identifier columns marked), the table's name in
    catalog ``lake`` and its location."""
    if table is None:
        return {}
    identifier_columns = [column for stream in streams for column in stream.identifier_columns or []]
    snapshot = table.current_snapshot()
    summary = snapshot.summary.additional_properties if snapshot and snapshot.summary else {}
    rows = int(summary.get("total-records", "0")) - int(summary.get("total-position-deletes", "0"))
    columns = [
        dg.TableColumn(
            name=field.name,
            type=str(field.field_type),
            description="identifier column" if field.name in identifier_columns else field.doc,
            constraints=dg.TableColumnConstraints(nullable=not field.required, unique=False),
        )
        for field in table.schema().fields
    ]
    return {
        names.ROW_COUNT_METADATA: rows,
        names.COLUMN_SCHEMA_METADATA: dg.TableSchema(columns=columns),
        names.TABLE_NAME_METADATA: f"{CATALOG_NAME}.{table_identifier}",
        names.URI_METADATA: table.location(),
    }
