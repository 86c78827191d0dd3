"""Per commit group, a job that evaluates only the freshness check of its tables, scheduled so a
stalled pipeline is noticed even when nothing commits."""

import dagster as dg

from lakehouse_assets.defs import names
from lakehouse_assets.defs.commit_groups import CommitGroup
from lakehouse_assets.runtime.run_liveness import RUN_KIND_TAG

FRESHNESS_CRON = "*/5 * * * *"


def freshness_job(group: CommitGroup):  # -> UnresolvedAssetJobDefinition, not exported by dagster
    """A job that runs only the freshness check of the group's tables (no Spark, no commit)."""
    return dg.define_asset_job(
        group.freshness_job_name,
        selection=dg.AssetSelection.checks(
            *(dg.AssetCheckKey(names.table_key(table), names.FRESHNESS_CHECK) for table in group.tables)
        ),
        tags={RUN_KIND_TAG: "freshness", names.PRIORITY_TAG: str(names.BACKGROUND_PRIORITY)},
        description=f"Evaluate {names.FRESHNESS_CHECK} of {group.label} (each stream's lag against max_lag).",
    )


def freshness_schedules(groups: list[CommitGroup]) -> list[dg.ScheduleDefinition]:
    """Every five minutes, per commit group, evaluate the freshness check of its tables."""
    return [
        dg.ScheduleDefinition(
            name=group.freshness_schedule_name,
            job_name=group.freshness_job_name,
            cron_schedule=FRESHNESS_CRON,
            execution_timezone="UTC",
            default_status=dg.DefaultScheduleStatus.RUNNING,
        )
        for group in groups
    ]
