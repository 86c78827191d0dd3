"""Per table, a job that evaluates only the freshness check, scheduled so a stalled pipeline is
noticed even when nothing commits."""

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
    """Every five minutes, per table, evaluate the freshness check."""
    return [
        dg.ScheduleDefinition(
            name=names.freshness_schedule_name(table_identifier),
            job_name=names.freshness_job_name(table_identifier),
            cron_schedule=FRESHNESS_CRON,
            execution_timezone="UTC",
            default_status=dg.DefaultScheduleStatus.RUNNING,
        )
        for table_identifier in config.tables()
    ]
