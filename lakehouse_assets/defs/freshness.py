"""Per table (per router for the tables it feeds), a job that evaluates only the freshness check,
scheduled so a stalled pipeline is noticed even when nothing commits."""

import dagster as dg

from lakehouse_assets.config import LakehouseConfig
from lakehouse_assets.defs import names

FRESHNESS_CRON = "*/5 * * * *"


def freshness_job(table_identifier: str):
    """A job that runs only the table's freshness check (no Spark, no commit)."""
    check = dg.AssetCheckKey(names.table_key(table_identifier), names.FRESHNESS_CHECK)
    return dg.define_asset_job(
        names.freshness_job_name(table_identifier),
        selection=dg.AssetSelection.checks(check),
        tags={names.RUN_KIND_TAG: "freshness", names.PRIORITY_TAG: str(names.BACKGROUND_PRIORITY)},
        description=f"Evaluate {names.FRESHNESS_CHECK} of {table_identifier} (each stream's lag against max_lag).",
    )


def freshness_schedules(config: LakehouseConfig) -> list[dg.ScheduleDefinition]:
    """Every five minutes, per table (per router for the tables it feeds), evaluate the freshness check."""
    jobs = {
        names.freshness_schedule_name(table): names.freshness_job_name(table)
        for table in config.tables
        if config.router_of(table) is None
    }
    for router in config.routers():
        if config.routed_tables(router.name):
            jobs[names.routed_freshness_schedule_name(router.name)] = names.routed_freshness_job_name(router.name)
    return [
        dg.ScheduleDefinition(
            name=name,
            job_name=job_name,
            cron_schedule=FRESHNESS_CRON,
            execution_timezone="UTC",
            default_status=dg.DefaultScheduleStatus.RUNNING,
        )
        for name, job_name in jobs.items()
    ]
