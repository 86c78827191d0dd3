"""Per commit group, a maintenance job for its tables and its schedule."""

import dagster as dg

from lakehouse_assets.config.spec import LakehouseConfig
from lakehouse_assets.defs import names
from lakehouse_assets.defs.commit_groups import CommitGroup
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.errors import describe_error
from lakehouse_assets.ops.maintenance import MaintenanceStep, maintain_table
from lakehouse_assets.quality.table_stats import table_stats
from lakehouse_assets.runtime.run_liveness import RUN_KIND_TAG


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


class MaintenanceConfig(dg.Config):
    """Which of the group's tables to maintain: by default all of them."""

    tables: list[str] = []


def maintenance_job(group: CommitGroup) -> dg.JobDefinition:
    """Compaction, manifest rewrite, snapshot expiry with a recovery checkpoint, orphan-file
    removal and landing retention for each table of ``group``, in one run and one Spark session,
    table by table; observes each table's figures after. A table whose maintenance fails is logged
    and the others go on (the run fails at the end)."""

    # Each table is maintained under its own commit lock (``maintain_table``), so a commit waits at
    # most for the one table being maintained. A table alone also holds its committer's pool; a
    # router's pass over hundreds of tables does not, or it would hold all their commits back.
    @dg.op(
        name=group.maintenance_op_name,
        pool=None if group.router else group.pool,
        description=f"Maintain {group.label} and the dead-letter tables, each under its commit lock.",
    )
    def maintain(
        context: dg.OpExecutionContext,
        config: MaintenanceConfig,
        lakehouse: LakehouseResource,
        spark: SparkResource,
    ) -> None:
        unknown = sorted(set(config.tables) - set(group.tables))
        if unknown:
            raise dg.Failure(f"tables: {', '.join(unknown)} are not among {group.label}")
        failed: dict[str, Exception] = {}
        for table_identifier in config.tables or group.tables:
            try:
                _maintain(context, lakehouse, spark, table_identifier)
            except Exception as error:  # noqa: BLE001 - one table's failure must not hold the others back
                context.log.error(f"{table_identifier}: maintenance failed: {describe_error(error)}")
                failed[table_identifier] = error
        if failed:
            raise dg.Failure(f"maintenance failed for {len(failed)} tables: {', '.join(failed)}") from next(
                iter(failed.values())
            )

    @dg.job(
        name=group.maintenance_job_name,
        description=f"Table maintenance for {group.label}; scheduled, or launch it on demand.",
        tags=group.run_tags(list(group.tables))
        | {RUN_KIND_TAG: "maintenance", names.PRIORITY_TAG: str(names.BACKGROUND_PRIORITY)},
    )
    def _job() -> None:
        maintain()

    return _job


def maintenance_schedules(config: LakehouseConfig, groups: list[CommitGroup]) -> list[dg.ScheduleDefinition]:
    """A schedule per commit group whose tables' maintenance has a ``schedule`` (cron, UTC)."""
    schedules = []
    for group in groups:
        cron = config.maintenance(next(iter(group.tables))).schedule
        if cron:
            schedules.append(
                dg.ScheduleDefinition(
                    name=group.maintenance_schedule_name,
                    job_name=group.maintenance_job_name,
                    cron_schedule=cron,
                    execution_timezone="UTC",
                    default_status=dg.DefaultScheduleStatus.RUNNING,
                )
            )
    return schedules
