"""Per table, a maintenance job (in the table's commit pool) and its schedule."""

import dagster as dg

from lakehouse_assets.config import LakehouseConfig
from lakehouse_assets.defs import names
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.maintenance import MaintenanceStep, maintain_table
from lakehouse_assets.table_metadata import load_committed_table
from lakehouse_assets.table_stats import table_stats


def _numeric_counts(step: MaintenanceStep) -> dict[str, int | float]:
    return {
        f"{step.action}.{key}": value
        for key, value in step.counts.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def maintenance_job(table_identifier: str) -> dg.JobDefinition:
    """Compaction, manifest rewrite, snapshot expiry with a recovery checkpoint, orphan-file
    removal and landing retention for ``table_identifier``; observes the table's figures after."""

    @dg.op(
        name=names.maintenance_op_name(table_identifier),
        pool=names.commit_pool(table_identifier),
        description=f"Maintain {table_identifier} and its dead-letter table, holding the table's commit slot.",
    )
    def maintain(context: dg.OpExecutionContext, lakehouse: LakehouseResource, spark: SparkResource) -> None:
        config, paths = lakehouse.config(), lakehouse.paths()
        steps = spark.run(lakehouse, maintain_table, config, paths, table_identifier)
        metadata: dict[str, int | float] = {}
        for step in steps:
            context.log.info(f"{step.table}: {step.action} in {step.seconds:.1f}s: {step.counts}")
            if step.table == table_identifier:
                metadata.update(_numeric_counts(step))
        metadata.update(table_stats(load_committed_table(config, paths, table_identifier)))
        context.log_event(dg.AssetObservation(asset_key=names.table_key(table_identifier), metadata=metadata))

    @dg.job(
        name=names.maintenance_job_name(table_identifier),
        description=f"Table maintenance for {table_identifier}; scheduled, or launch it on demand.",
        tags={
            names.TABLE_TAG: table_identifier,
            names.RUN_KIND_TAG: "maintenance",
            names.PRIORITY_TAG: str(names.BACKGROUND_PRIORITY),
        },
    )
    def _job() -> None:
        maintain()

    return _job


def maintenance_schedules(config: LakehouseConfig) -> list[dg.ScheduleDefinition]:
    """A schedule per table whose maintenance has a ``schedule`` (cron, UTC)."""
    schedules = []
    for table_identifier in config.tables():
        cron = config.maintenance(table_identifier).schedule
        if cron:
            schedules.append(
                dg.ScheduleDefinition(
                    name=names.maintenance_schedule_name(table_identifier),
                    job_name=names.maintenance_job_name(table_identifier),
                    cron_schedule=cron,
                    execution_timezone="UTC",
                    default_status=dg.DefaultScheduleStatus.RUNNING,
                )
            )
    return schedules
