"""DuckDB checks on the exact snapshot the last materialization of a table committed."""

import dagster as dg

from lakehouse_assets import checks
from lakehouse_assets.config import StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.duck import iceberg_connection


def committed_snapshot(context: dg.AssetCheckExecutionContext, asset_key: dg.AssetKey) -> checks.CommittedSnapshot:
    """The snapshot recorded by the latest materialization of ``asset_key``."""
    event = context.instance.get_latest_materialization_event(asset_key)
    if event is None or event.asset_materialization is None:
        raise dg.Failure(f"{asset_key.to_user_string()} has no committed snapshot to check yet")
    metadata = event.asset_materialization.metadata
    return checks.CommittedSnapshot(
        metadata_location=metadata["metadata_location"].value,
        snapshot_id=int(metadata["snapshot_id"].value),
    )


def _result(outcome: checks.CheckOutcome, snapshot: checks.CommittedSnapshot) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=outcome.passed,
        description=outcome.description,
        metadata={
            **outcome.metadata,
            "snapshot_id": str(snapshot.snapshot_id),
            "found": outcome.description,
        },
    )


def table_checks(table_identifier: str, streams: list[StreamSpec]) -> list[dg.AssetChecksDefinition]:
    """The four commit checks of one table, each reading the committed snapshot with DuckDB."""
    asset_key = names.table_key(table_identifier)
    declared = streams[0].table_schema.columns

    @dg.asset_check(
        asset=asset_key,
        name=names.SCHEMA_CHECK,
        blocking=True,
        description="The committed snapshot's columns, types and required flags are as declared.",
    )
    def schema_matches_declared(
        context: dg.AssetCheckExecutionContext,
    ) -> dg.AssetCheckResult:
        snapshot = committed_snapshot(context, asset_key)
        return _result(checks.check_schema(iceberg_connection(), snapshot, declared), snapshot)

    @dg.asset_check(
        asset=asset_key,
        name=names.ROW_COUNT_CHECK,
        blocking=True,
        description="DuckDB's row count equals the rows of every committed batch.",
    )
    def rows_reconcile_with_batches(
        context: dg.AssetCheckExecutionContext,
    ) -> dg.AssetCheckResult:
        snapshot = committed_snapshot(context, asset_key)
        return _result(checks.check_row_count(iceberg_connection(), snapshot), snapshot)

    @dg.asset_check(
        asset=asset_key,
        name=names.SEQUENCE_CHECK,
        blocking=True,
        description="Batch ranges along the ancestry have no gap, overlap or repeat.",
    )
    def batch_ranges_contiguous(
        context: dg.AssetCheckExecutionContext,
    ) -> dg.AssetCheckResult:
        snapshot = committed_snapshot(context, asset_key)
        return _result(checks.check_sequence_ranges(snapshot), snapshot)

    @dg.asset_check(
        asset=asset_key,
        name=names.DATA_FILES_CHECK,
        blocking=True,
        description="No data file is referenced twice by the committed snapshot.",
    )
    def data_files_unique(
        context: dg.AssetCheckExecutionContext,
    ) -> dg.AssetCheckResult:
        snapshot = committed_snapshot(context, asset_key)
        return _result(checks.check_unique_data_files(iceberg_connection(), snapshot), snapshot)

    return [
        schema_matches_declared,
        rows_reconcile_with_batches,
        batch_ranges_contiguous,
        data_files_unique,
    ]
