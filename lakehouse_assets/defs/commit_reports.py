"""How a committer pass shows in Dagster, whichever committer ran it (a commit group's, or a
routing run's for tables new to the loaded definitions): its commits as materializations of the
table with Dagster's standard table metadata, what each stream waits on in the log, and the days
it completed."""

from datetime import date, timedelta
from typing import Any

import dagster as dg
from pyiceberg.table import Table

from lakehouse_assets.catalog.table_metadata import CATALOG_NAME
from lakehouse_assets.commit.committer import CommitOutcome, CommitResult
from lakehouse_assets.commit.completeness import complete_days, table_watermark
from lakehouse_assets.commit.dead_letters import dead_letter_identifier
from lakehouse_assets.commit.recovery import AUDIT_BRANCH, table_history
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.errors import SequenceGapError
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
    """One committer pass as Dagster shows it, for every committer (a commit group's,
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
