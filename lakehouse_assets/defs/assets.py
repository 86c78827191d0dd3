"""The staged-batches asset of each stream (the writer or router) and the Iceberg table asset (the committer)."""

import time
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

import dagster as dg
from pyiceberg.table import Table

from lakehouse_assets.catalog.table_metadata import CATALOG_NAME
from lakehouse_assets.commit.branches import AuditState
from lakehouse_assets.commit.committer import CommitOutcome, CommitResult, commit_table, seconds_until_commit_due
from lakehouse_assets.commit.dead_letters import dead_letter_identifier
from lakehouse_assets.commit.recovery import AUDIT_BRANCH, table_history
from lakehouse_assets.config import StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.check_status import failed_checks
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.errors import SequenceGapError
from lakehouse_assets.fan_in import commit_new_routes
from lakehouse_assets.ingest.landing import http_events_in
from lakehouse_assets.ingest.routing import route_batches
from lakehouse_assets.ingest.staging import minted_record, stage_batch
from lakehouse_assets.quality.completeness import complete_days, table_watermark
from lakehouse_assets.quality.lag import stream_lag_seconds
from lakehouse_assets.quality.table_stats import table_stats

NEW_TABLES_NAMED = 10
"""How many new routed tables the router's warning names (the metadata lists them all)."""


class StagedBatchConfig(dg.Config):
    """The batch a writer run stages: its sequence and exact landing files, set by the sensor."""

    sequence: int
    files: list[str]


def staged_batches_asset(stream: StreamSpec) -> dg.AssetsDefinition:
    """The writer: stages one minted batch of ``stream`` invisibly to the table's readers."""

    @dg.asset(
        key=names.staged_batches_key(stream.name),
        group_name=names.GROUP_NAME,
        deps=[names.source_key(stream.name)] if stream.iceberg_source else [],
        kinds={"spark", "parquet"},
        description=f"Batches of stream `{stream.name}` staged for {stream.table_identifier}, not yet visible.",
    )
    def staged_batches(
        context: dg.AssetExecutionContext,
        config: StagedBatchConfig,
        lakehouse: LakehouseResource,
        spark: SparkResource,
    ) -> dg.MaterializeResult:
        started = time.monotonic()
        lake = lakehouse.lake()
        outcome = spark.run(
            lake,
            stage_batch,
            lake.stream(stream.name),
            config.sequence,
            expected_files=config.files,
            run_id=context.run.run_id,
        )
        staged = outcome.staged
        http_files, http_events = http_events_in(outcome.files)
        context.log.info(
            f"batch {staged.sequence}: {staged.rows} rows staged, {staged.rejected} rejected"
            + ("" if outcome.written_now else " (already staged by an earlier attempt)")
        )
        return dg.MaterializeResult(
            metadata={
                "sequence": staged.sequence,
                "rows": staged.rows,
                "rejected": staged.rejected,
                "files": len(outcome.files),
                # What came over HTTP (`lakehouse serve`).
                "http_files": http_files,
                "http_events": http_events,
                "bytes": outcome.bytes,
                "attempt": staged.attempt,
                "written_by_this_run": outcome.written_now,
                # The table's staged snapshot holding the rows (written once), or "" (staged Parquet).
                "staged_snapshot": str(staged.staged_snapshot or ""),
                "max_event_time": staged.max_event_time or "",
                "stage_seconds": round(time.monotonic() - started, 3),
            }
        )

    return staged_batches


def router_asset(stream: StreamSpec, loaded_tables: frozenset[str]) -> dg.AssetsDefinition:
    """The writer of a stream with a dynamic ``table_identifier``: routes each minted batch to one
    derived stream per table. ``loaded_tables`` are the tables these definitions have committers for."""

    @dg.asset(
        key=names.staged_batches_key(stream.name),
        group_name=names.GROUP_NAME,
        kinds={"spark"},
        description=(
            f"Batches of stream `{stream.name}` routed by `{stream.table_identifier}`, one derived stream per table."
        ),
    )
    def routed_batches(
        context: dg.AssetExecutionContext,
        config: StagedBatchConfig,
        lakehouse: LakehouseResource,
        spark: SparkResource,
    ) -> dg.MaterializeResult:
        lake = lakehouse.lake()
        router = lake.stream(stream.name)
        minted_record(lake.ledger(stream.name), router, config.sequence, config.files)
        routed = spark.run(lake, route_batches, router, config.sequence, context.run.run_id)
        events: dict[str, int] = {}
        for batch in routed:
            context.log.info(f"batch {batch.sequence}: routed {batch.routes}, {batch.rejected} to the dead letters")
            for table, count in batch.routes.items():
                events[table] = events.get(table, 0) + count
        new_tables = sorted(set(events) - loaded_tables)
        if new_tables and not lakehouse.until_idle:
            # Dagster cannot add sensors to a loaded code location: until it is reloaded, this run
            # commits the new tables.
            shown = ", ".join(new_tables[:NEW_TABLES_NAMED]) + (", ..." if len(new_tables) > NEW_TABLES_NAMED else "")
            context.log.warning(
                f"{len(new_tables)} new routed tables ({shown}): committed by this run; reload the code location "
                "to give them their asset, checks and maintenance"
            )
            # The configuration read again: routing gave each new table its derived stream.
            committed = spark.run(lakehouse.lake(), commit_new_routes, router, new_tables, context.run.run_id)
            # Reported as every committer pass is (``report_commit_pass``), as events: this run's
            # asset is the router's staging asset, not the tables'.
            for table, outcome in committed.outcomes.items():
                result = report_commit_pass(context, lakehouse, table, lakehouse.lake().config.tables[table], outcome)
                if result is not None:
                    context.log_event(dg.AssetMaterialization(names.table_key(table), metadata=result.metadata))
            if committed.failed:
                for table, error in committed.failed.items():
                    context.log.error(f"{table}: {error}")
                raise dg.Failure(f"new routed tables failed: {', '.join(sorted(committed.failed))}")
        return dg.MaterializeResult(
            metadata={
                "sequence": config.sequence,
                "batches_routed": len(routed),
                "events_routed": dg.JsonMetadataValue(events),
                "rejected": sum(batch.rejected for batch in routed),
                "dead_letter_table": router.router_dead_letter_identifier,
                "new_tables": dg.JsonMetadataValue(new_tables),
            }
        )

    return routed_batches


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


def complete_days_asset(table_identifier: str, streams: list[StreamSpec]) -> dg.AssetSpec:
    """The daily-partitioned signal "day D of the table is complete", reported by the committer."""
    start = min(stream.completeness.start_date for stream in streams if stream.completeness)
    return dg.AssetSpec(
        key=names.complete_days_key(table_identifier),
        deps=[names.table_key(table_identifier)],
        partitions_def=dg.DailyPartitionsDefinition(start_date=start.isoformat(), timezone="UTC"),
        group_name=names.GROUP_NAME,
        kinds={"iceberg"},
        description=(
            f"Day D is materialized once the event-time watermark of {table_identifier} passes the end of D. "
            "Daily-partitioned assets that depend on it can wait for complete days."
        ),
    )


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


def _awaiting_publish(
    context: dg.AssetExecutionContext,
    lakehouse: LakehouseResource,
    table_identifier: str,
    streams: list[StreamSpec],
    state: AuditState,
) -> Iterator[dg.MaterializeResult]:
    """The audit branch holds commits main does not. When a check failed on them, publishing stays
    stopped until the user acts; otherwise (a run died before its checks or its publish) the
    audited snapshot is reported again, so its checks run and it is published."""
    failed = failed_checks(context.instance, table_identifier, streams, state.audit)
    ranges = state.unpublished_ranges()
    if failed:
        context.log.warning(
            f"{table_identifier}: publishing stopped at audited snapshot {state.audit} (batches {ranges}): "
            + "; ".join(f"{name} {found}" for name, found in failed.items())
            + f". Later batches stay staged. Fix, then run job {names.publish_job_name(table_identifier)} "
            f"(or `lakehouse audit publish --table {table_identifier}`), or discard the audited batches with "
            f"`lakehouse audit discard --table {table_identifier}`"
        )
        return
    context.log.info(f"{table_identifier}: audited snapshot {state.audit} is not published yet; checking it again")
    yield dg.MaterializeResult(
        metadata={
            "snapshot_id": str(state.audit),
            "metadata_location": lakehouse.lake().metadata_location(table_identifier),
            "branch": AUDIT_BRANCH,
            "reported_again": True,
            names.RUN_RANGES_METADATA: dg.JsonMetadataValue(ranges),
        }
    )


def log_commit_pass(
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


def report_commit_pass(
    context: dg.AssetExecutionContext,
    lakehouse: LakehouseResource,
    table_identifier: str,
    streams: list[StreamSpec],
    outcome: CommitOutcome,
) -> dg.MaterializeResult | None:
    """One committer pass as Dagster shows it, for every committer (a table's, the routed tables',
    a routing run's for new tables): what each stream waits on and the days it completed, in the
    log; every commit but the last as a materialization of the table; the last one's returned
    (None when the pass committed nothing)."""
    log_commit_pass(context, lakehouse, table_identifier, streams, outcome)
    if not outcome.results:
        return None
    metadata = commits_metadata(context, lakehouse, table_identifier, streams, outcome)
    return dg.MaterializeResult(asset_key=names.table_key(table_identifier), metadata=metadata)


def commits_metadata(
    context: dg.AssetExecutionContext,
    lakehouse: LakehouseResource,
    table_identifier: str,
    streams: list[StreamSpec],
    outcome: CommitOutcome,
) -> dict:
    """Log every commit of the pass but the last as a materialization of the table; the last one's
    metadata, with the table's figures after it and each stream's backlog."""
    lake = lakehouse.lake()
    table = lake.table(table_identifier)
    after: dict[str, Any] = table_stats(table) | {
        f"lag_seconds.{stream.name}": round(stream_lag_seconds(lake.paths, stream, table), 3) for stream in streams
    }
    for result in outcome.results[:-1]:
        context.log_event(dg.AssetMaterialization(names.table_key(table_identifier), metadata=commit_metadata(result)))
    if lake.config.audits(table_identifier):
        after["branch"] = AUDIT_BRANCH
    keys = [column for stream in streams for column in stream.identifier_columns or []]
    standard = standard_table_metadata(table_identifier, table, keys) if table else {}
    return (
        commit_metadata(outcome.results[-1])
        | after
        | {names.RUN_RANGES_METADATA: dg.JsonMetadataValue(run_ranges(outcome))}
        | standard
    )


def standard_table_metadata(table_identifier: str, table: Table, identifier_columns: list[str]) -> dict:
    """Dagster's standard table metadata: live rows (records less position deletes; the pipeline
    writes no equality deletes), the columns with their Iceberg types (identifier columns marked),
    the table's name in catalog ``lake`` and its location."""
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


def sequence_gap_evaluation(asset_key: dg.AssetKey, gap: SequenceGapError) -> dg.AssetCheckEvaluation:
    """The failed ``batch_ranges_contiguous`` a gap in a stream's batches shows on its table."""
    return dg.AssetCheckEvaluation(
        asset_key=asset_key, check_name=names.SEQUENCE_CHECK, passed=False, metadata={"found": str(gap)}
    )


def commit_due_in(lakehouse: LakehouseResource, table_identifier: str, streams: list[StreamSpec]) -> float:
    """Seconds until ``commit_interval`` lets a writer run commit to the table (0: now)."""
    if lakehouse.until_idle:
        return 0.0
    return seconds_until_commit_due(lakehouse.lake().table(table_identifier), streams)


def table_asset(table_identifier: str, streams: list[StreamSpec]) -> dg.AssetsDefinition:
    """The committer: publishes ready staged batches to ``table_identifier``, one commit per stream."""

    @dg.asset(
        key=names.table_key(table_identifier),
        group_name=names.GROUP_NAME,
        deps=[names.staged_batches_key(stream.name) for stream in streams],
        kinds={"iceberg", "spark"},
        pool=names.commit_pool(table_identifier),
        output_required=False,
        description=f"Iceberg table {table_identifier}; one materialization per commit.",
    )
    def iceberg_table(
        context: dg.AssetExecutionContext,
        lakehouse: LakehouseResource,
        spark: SparkResource,
    ) -> Iterator[dg.MaterializeResult]:
        if context.job_name != names.commit_job_name(table_identifier):
            # A writer run commits what it staged only when commit_interval allows; otherwise the
            # committer run, which the staged-batches sensor launches once it has, commits it.
            wait = commit_due_in(lakehouse, table_identifier, streams)
            if wait > 0:
                context.log.info(f"commit_interval: {wait:.1f}s until the next commit; the committer run commits then")
                return
        try:
            outcome = spark.run(lakehouse.lake(), commit_table, table_identifier, context.run.run_id)
        except SequenceGapError as gap:
            # A gap must be loud: fail the run, and fail the sequence check where the UI shows it.
            context.log_event(sequence_gap_evaluation(context.asset_key, gap))
            raise
        if outcome.awaiting_publish:
            log_commit_pass(context, lakehouse, table_identifier, streams, outcome)
            yield from _awaiting_publish(context, lakehouse, table_identifier, streams, outcome.awaiting_publish)
            return
        result = report_commit_pass(context, lakehouse, table_identifier, streams, outcome)
        if result is None:
            context.log.info("nothing committed; the table is unchanged")
            return
        yield result

    return iceberg_table
