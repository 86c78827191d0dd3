"""Per table, a maintenance job (in the table's commit pool) and its schedule; per router, one
job and schedule for all the tables it feeds."""

import dagster as dg

from lakehouse_assets.config import LakehouseConfig, StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.ops.maintenance import MaintenanceStep, maintain_table
from lakehouse_assets.quality.table_stats import table_stats


def _numeric_counts(step: MaintenanceStep) -> dict[str, int | float]:
    return {
        f"{step.action}.{key}": value
        for key, value in step.counts.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def _maintain(
    context: dg.OpExecutionContext, lakehouse: LakehouseResource, spark: SparkResource, table_identifier: str
) -> None:
    """Maintain one table and its dead-letter table; observe the table's figures after."""
    lake = lakehouse.lake()
    steps = spark.run(lake, maintain_table, table_identifier)
    metadata: dict[str, int | float] = {}
    for step in steps:
        context.log.info(f"{step.table}: {step.action} in {step.seconds:.1f}s: {step.counts}")
        if step.table == table_identifier:
            metadata.update(_numeric_counts(step))
    metadata.update(table_stats(lake.table(table_identifier)))
    context.log_event(dg.AssetObservation(asset_key=names.table_key(table_identifier), metadata=metadata))


def _maintenance_tags(table_identifier: str | None = None) -> dict[str, str]:
    table = {names.TABLE_TAG: table_identifier} if table_identifier else {}
    return table | {names.RUN_KIND_TAG: "maintenance", names.PRIORITY_TAG: str(names.BACKGROUND_PRIORITY)}


def maintenance_job(table_identifier: str) -> dg.JobDefinition:
    """Compaction, manifest rewrite, snapshot expiry with a recovery checkpoint, orphan-file
    removal and landing retention for ``table_identifier``; observes the table's figures after."""

    @dg.op(
        name=names.maintenance_op_name(table_identifier),
        pool=names.commit_pool(table_identifier),
        description=f"Maintain {table_identifier} and its dead-letter table, holding the table's commit slot.",
    )
    def maintain(context: dg.OpExecutionContext, lakehouse: LakehouseResource, spark: SparkResource) -> None:
        _maintain(context, lakehouse, spark, table_identifier)

    @dg.job(
        name=names.maintenance_job_name(table_identifier),
        description=f"Table maintenance for {table_identifier}; scheduled, or launch it on demand.",
        tags=_maintenance_tags(table_identifier),
    )
    def _job() -> None:
        maintain()

    return _job


class RoutedMaintenanceConfig(dg.Config):
    """Which of the router's tables to maintain: by default all of them."""

    tables: list[str] = []


def routed_maintenance_job(router: StreamSpec, tables: list[str]) -> dg.JobDefinition:
    """Maintenance of every table ``router`` feeds in one run and one Spark session, table by
    table; a table whose maintenance fails is logged and the others go on (the run fails at the end)."""

    # Not in the tables' shared commit pool: a long pass over hundreds of tables would hold every
    # commit back. Each table is maintained under its own commit lock (``maintain_table``), so a
    # commit waits at most for the one table being maintained.
    @dg.op(
        name=names.routed_maintenance_op_name(router.name),
        description=f"Maintain the tables stream {router.name} routes to, each under its commit lock.",
    )
    def maintain(
        context: dg.OpExecutionContext,
        config: RoutedMaintenanceConfig,
        lakehouse: LakehouseResource,
        spark: SparkResource,
    ) -> None:
        failed = []
        for table_identifier in config.tables or tables:
            try:
                _maintain(context, lakehouse, spark, table_identifier)
            except Exception as error:  # noqa: BLE001 - one table's failure must not hold the others back
                context.log.error(f"{table_identifier}: maintenance failed: {error}")
                failed.append(table_identifier)
        if failed:
            raise dg.Failure(f"maintenance failed for {len(failed)} tables: {', '.join(failed)}")

    @dg.job(
        name=names.routed_maintenance_job_name(router.name),
        description=f"Table maintenance for the tables stream {router.name} routes to; scheduled, or on demand.",
        tags=_maintenance_tags(),
    )
    def _job() -> None:
        maintain()

    return _job


def maintenance_schedules(config: LakehouseConfig) -> list[dg.ScheduleDefinition]:
    """A schedule per table whose maintenance has a ``schedule`` (cron, UTC); one per router for
    the tables it feeds."""
    schedules = []
    for table_identifier in config.tables:
        cron = config.maintenance(table_identifier).schedule
        if cron and config.router_of(table_identifier) is None:
            name = names.maintenance_schedule_name(table_identifier)
            schedules.append(_schedule(name, names.maintenance_job_name(table_identifier), cron))
    for router in config.routers():
        if router.maintenance.schedule and config.routed_tables(router.name):
            schedules.append(
                _schedule(
                    names.routed_maintenance_schedule_name(router.name),
                    names.routed_maintenance_job_name(router.name),
                    router.maintenance.schedule,
                )
            )
    return schedules


def _schedule(name: str, job_name: str, cron: str) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name=name,
        job_name=job_name,
        cron_schedule=cron,
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
    )
