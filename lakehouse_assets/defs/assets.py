"""The staged-batches asset of each stream (the writer or router), and the complete-days signal of a table.

The table assets are the commit groups' (``defs.committer``)."""

import time

import dagster as dg

from lakehouse_assets.batches.headroom import uncommitted_landing_bytes
from lakehouse_assets.batches.landing import http_events_in
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.checks import table_check_registry
from lakehouse_assets.defs.commit_reports import CommitFailures, report_commit
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.ingest.fan_in import NewRoutes, commit_new_routes
from lakehouse_assets.ingest.kafka_batching import kafka_progress
from lakehouse_assets.ingest.routing import route_batches
from lakehouse_assets.ingest.staging import minted_record, stage_batch
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.storage_space import space_of

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
        kafka = _kafka_metadata(lake, lake.stream(stream.name), config.sequence) if stream.kafka_source else {}
        if staged.lost_offsets:
            context.log.warning(f"batch {staged.sequence}: skipped offsets the log had deleted: {staged.lost_offsets}")
        return dg.MaterializeResult(
            metadata=kafka
            | {
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
                # The storage root's room (``lakehouse status`` shows every stream's backlog).
                "storage_free_bytes": space_of(lake.paths.storage).free_bytes,
                "landed_not_committed_bytes": uncommitted_landing_bytes(lake.paths, stream),
            }
        )

    return staged_batches


def _kafka_metadata(lake: Lakehouse, stream: StreamSpec, sequence: int) -> dict[str, dg.MetadataValue]:
    """A Kafka batch's offset ranges and what it skipped, and per partition the offset committed to
    the table and the lag behind the log's end."""
    record = lake.ledger(stream.name).require(sequence)
    progress = kafka_progress(lake, stream)
    lost = record.staged.lost_offsets if record.staged else {}
    return {
        "kafka_offsets": dg.MetadataValue.json(record.minted.offsets),
        "kafka_records": dg.MetadataValue.int(record.minted.records),
        "kafka_lost_offsets": dg.MetadataValue.json(lost),
        "kafka_partitions": dg.MetadataValue.json(progress.partitions),
        "kafka_lag": dg.MetadataValue.text(str(progress.lag if progress.error is None else progress.error)),
    }


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
            _report_new_routes(context, lakehouse, committed)
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


def _report_new_routes(context: dg.AssetExecutionContext, lakehouse: LakehouseResource, committed: NewRoutes) -> None:
    """Each new routed table's pass reported as every commit is (``report_commit``: its commits,
    its checks on what it committed), as events: this run's asset is the router's staging asset,
    not the tables'. Fails the run naming every table that failed."""
    failures = CommitFailures()
    for table, error in committed.failed.items():
        context.log.error(f"{table}: {error}")
        failures.add(table, error)
    tables = lakehouse.lake().config.tables
    for table, outcome in committed.outcomes.items():
        table_checks = table_check_registry(table, tables[table])
        for result in report_commit(context, lakehouse, table, tables[table], table_checks, outcome, failures):
            context.log_event(dg.AssetMaterialization(names.table_key(table), metadata=result.metadata))
    failures.raise_any()


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
