"""An Iceberg source stream's assets: the change export (``source/<stream>``), the search-index
bulk files (``search_export/<stream>``), their job and the sensor that polls the source."""

import dagster as dg

from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.runtime.run_liveness import RUN_KIND_TAG
from lakehouse_assets.source.iceberg_source import emit_source_changes, load_source_table, read_cursor
from lakehouse_assets.source.search_export import export_bulk_files


def source_assets(stream: StreamSpec) -> list[dg.AssetsDefinition]:
    """The change export of the stream's source table and its bulk NDJSON for search indexes."""
    source = stream.source_table

    @dg.asset(
        key=names.source_key(stream.name),
        group_name=names.GROUP_NAME,
        kinds={"iceberg", "spark"},
        description=f"Changes of {source.table}, one landing file set per source snapshot, for `{stream.name}`.",
    )
    def source_changes(
        context: dg.AssetExecutionContext, lakehouse: LakehouseResource, spark: SparkResource
    ) -> dg.MaterializeResult:
        lake = lakehouse.lake()
        current = lake.stream(stream.name)
        emitted = spark.run(lake, emit_source_changes, current)
        events: dict[str, int] = {}
        for snapshot in emitted:
            context.log.info(f"source snapshot {snapshot.snapshot_id}: {snapshot.kind}, events {snapshot.events}")
            for operation, count in snapshot.events.items():
                events[operation] = events.get(operation, 0) + count
        cursor = read_cursor(lake.paths, current)
        return dg.MaterializeResult(
            metadata={
                "source_table": source.table,
                "snapshots_processed": len(emitted),
                "kinds": dg.JsonMetadataValue({str(s.snapshot_id): s.kind for s in emitted}),
                "events": dg.JsonMetadataValue(events),
                "landing_files": sum(len(s.files) for s in emitted),
                "source_snapshot": str(cursor.snapshot_id) if cursor else "",
            }
        )

    @dg.asset(
        key=names.search_export_key(stream.name),
        deps=[names.source_key(stream.name)],
        group_name=names.GROUP_NAME,
        kinds={"opensearch"},
        description=f"OpenSearch/Elasticsearch bulk NDJSON of the changes of {source.table} (`_id` = document_id).",
    )
    def search_export(lakehouse: LakehouseResource) -> dg.MaterializeResult:
        lake = lakehouse.lake()
        export = export_bulk_files(lake.paths, lake.stream(stream.name))
        return dg.MaterializeResult(
            metadata={
                "files_written": len(export.files),
                "index_actions": export.index_actions,
                "delete_actions": export.delete_actions,
                "directory": str(lake.paths.exports(stream.name)),
            }
        )

    return [source_changes, search_export]


def source_job(stream: StreamSpec):
    """The change export and search export of the stream's source, run by its sensor."""
    return dg.define_asset_job(
        names.source_job_name(stream.name),
        selection=dg.AssetSelection.assets(names.source_key(stream.name), names.search_export_key(stream.name)),
        tags={RUN_KIND_TAG: "source"},
        description=f"Export the new snapshots of {stream.source_table.table} as change events.",
    )


def source_sensor(stream: StreamSpec) -> dg.SensorDefinition:
    """Requests a source run when the source table has a snapshot the stream has not processed."""

    @dg.sensor(
        name=names.source_sensor_name(stream.name),
        job_name=names.source_job_name(stream.name),
        minimum_interval_seconds=max(1, int(stream.source_table.polling_interval)),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Polls {stream.source_table.table} every polling_interval for new snapshots.",
    )
    def _sensor(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource) -> dg.RunRequest | dg.SkipReason:
        lake = lakehouse.lake()
        current = lake.stream(stream.name)
        table = load_source_table(lake, current)
        snapshot = table.current_snapshot() if table else None
        if snapshot is None:
            return dg.SkipReason(f"source {current.source_table.table} has no snapshot yet")
        cursor = read_cursor(lake.paths, current)
        if cursor is not None and cursor.snapshot_id == snapshot.snapshot_id:
            return dg.SkipReason(f"source snapshot {snapshot.snapshot_id} is processed")
        return dg.RunRequest(
            run_key=f"{stream.name}:source:{snapshot.snapshot_id}",
            tags={names.STREAM_TAG: stream.name, "lakehouse/source-snapshot": str(snapshot.snapshot_id)},
        )

    return _sensor
