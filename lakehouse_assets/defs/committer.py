"""The committer of a commit group: one multi-asset, one job and one check step for all the
group's tables.

Each table stays its own asset, with its commits, checks and lineage in the UI. One step commits
the selected tables that have work, each in its own Iceberg commit (its own lock, summary keys,
fence and recovery), two at a time in one process and one Spark session, and evaluates each
commit's checks on the snapshot it committed. A table whose commit or blocking check fails is
reported on that table; the others go on, and the step fails at the end naming it. Checks run on
their own (``lakehouse check``, the freshness and publish jobs, the UI) are the group's check
step, outside the commit pool, on the tables' current or last materialized snapshots.
"""

from collections.abc import Iterator
from functools import partial

import dagster as dg

from lakehouse_assets.commit.committer import seconds_until_commit_due
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.checks import TableCheck, checked_target, table_check_registry
from lakehouse_assets.defs.commit_groups import CommitGroup
from lakehouse_assets.defs.commit_reports import CommitFailures, report_commit
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.errors import describe_error
from lakehouse_assets.ingest.fan_in import commit_concurrently, stage_routed_tables, tables_with_pending_routes
from lakehouse_assets.ingest.table_commits import commit_table
from lakehouse_assets.runtime.run_liveness import RUN_KIND_TAG


class CommitGroupConfig(dg.Config):
    """Which of the group's tables a run works on: by default every table it selects."""

    tables: list[str] = []


def committer_definitions(group: CommitGroup) -> tuple[dg.AssetsDefinition, dg.AssetChecksDefinition]:
    """The group's committer multi-asset and the step of its tables' checks."""
    registry = {table: table_check_registry(table, streams) for table, streams in group.tables.items()}
    tables_by_key = {names.table_key(table): table for table in group.tables}
    return _committer_asset(group, registry, tables_by_key), _group_checks(group, registry, tables_by_key)


def _committer_asset(
    group: CommitGroup, registry: dict[str, list[TableCheck]], tables_by_key: dict[dg.AssetKey, str]
) -> dg.AssetsDefinition:
    """The committer of ``group``: stages a router's pending routes, commits each selected table
    with ready batches and evaluates its checks on the snapshot it committed."""

    @dg.multi_asset(
        name=group.op_name,
        specs=[
            dg.AssetSpec(
                names.table_key(table),
                deps=group.upstream_keys(table),
                group_name=names.GROUP_NAME,
                kinds={"iceberg", "spark"},
                skippable=True,
                description=f"Iceberg table {table}"
                + (f", routed by stream `{group.router.name}`" if group.router else "")
                + "; one materialization per commit.",
            )
            for table in group.tables
        ],
        can_subset=True,
        pool=group.pool,
    )
    def committer(
        context: dg.AssetExecutionContext,
        config: CommitGroupConfig,
        lakehouse: LakehouseResource,
        spark: SparkResource,
    ) -> Iterator[dg.MaterializeResult]:
        selected = [tables_by_key[key] for key in sorted(context.selected_asset_keys)]
        failures = CommitFailures()
        yield from _commit_and_check(
            context, lakehouse, spark, group, registry, _wanted(group, config, selected), failures
        )
        failures.raise_any()

    return committer


def _group_checks(
    group: CommitGroup, registry: dict[str, list[TableCheck]], tables_by_key: dict[dg.AssetKey, str]
) -> dg.AssetChecksDefinition:
    """The checks of the group's tables, in their own step outside the commit pool (a check,
    freshness or publish job, the UI): each on the snapshot a check run reads
    (``checks.checked_target``: the current one in a check or publish job, else the last
    materialized). A committing run evaluates the checks of what it committed itself."""

    @dg.multi_asset_check(
        name=group.checks_op_name,
        specs=[
            dg.AssetCheckSpec(
                check.name, asset=names.table_key(table), blocking=check.blocking, description=check.description
            )
            for table, table_checks in registry.items()
            for check in table_checks
        ],
        can_subset=True,
    )
    def table_checks(
        context: dg.AssetCheckExecutionContext, config: CommitGroupConfig, lakehouse: LakehouseResource
    ) -> Iterator[dg.AssetCheckResult]:
        selected = set(context.selected_asset_check_keys)
        for table in _wanted(group, config, sorted({tables_by_key[check.asset_key] for check in selected})):
            key = names.table_key(table)
            target = partial(checked_target, context.instance, lakehouse, table)
            for check in registry[table]:
                if dg.AssetCheckKey(key, check.name) in selected:
                    yield check.result(key, lakehouse, target)

    return table_checks


def _wanted(group: CommitGroup, config: CommitGroupConfig, selected: list[str]) -> list[str]:
    """The selected tables that run config ``tables`` names (all of them when it names none)."""
    unknown = sorted(set(config.tables) - set(group.tables))
    if unknown:
        raise dg.Failure(f"tables: {', '.join(unknown)} are not among {group.label}")
    return [table for table in selected if not config.tables or table in config.tables]


def _commit_and_check(
    context: dg.AssetExecutionContext,
    lakehouse: LakehouseResource,
    spark: SparkResource,
    group: CommitGroup,
    registry: dict[str, list[TableCheck]],
    selected: list[str],
    failures: CommitFailures,
) -> Iterator[dg.MaterializeResult]:
    """Commit the selected tables that have work, each on its own, reporting each as it lands. A
    router's tables are staged here first, from their route files; other tables' batches were
    staged by their writer runs. A writer run commits only what ``commit_interval`` allows."""
    if not selected:
        return
    lake = lakehouse.lake()
    pending = selected
    if group.router:
        pending = tables_with_pending_routes(lake.paths, group.router, selected)
        if not pending:
            context.log.info(f"none of the {len(selected)} selected tables has routes to commit")
            return
        not_staged = spark.run(lake, stage_routed_tables, group.router, pending, context.run.run_id)
        for table, error in not_staged.items():
            context.log.error(f"{table}: staging failed: {error}")
            failures.add(table, error)
        pending = [table for table in pending if table not in not_staged]
        context.log.info(f"staged the routes of {len(pending)} tables; committing them")
    on_commit_job = context.job_name == group.commit_job_name
    waits = {table: 0.0 if on_commit_job else commit_due_in(lakehouse, table, group.tables[table]) for table in pending}
    due = [table for table, wait in waits.items() if wait <= 0]
    if len(due) < len(waits):
        # The committer run, which the group's sensor launches once it is due, commits it then.
        first = min(wait for wait in waits.values() if wait > 0)
        context.log.info(
            f"commit_interval: {len(waits) - len(due)} of the tables are not due yet (the first in {first:.1f}s); "
            "the committer run commits them then"
        )
    commit = partial(spark.run, lake, commit_table, run_id=context.run.run_id)
    for table, outcome in commit_concurrently(commit, due):
        try:
            yield from report_commit(context, lakehouse, table, group.tables[table], registry[table], outcome, failures)
        except Exception as error:  # noqa: BLE001 - one table's report must not lose the others'
            context.log.error(f"{table}: reporting its commit failed: {describe_error(error)}")
            failures.add(table, error, error)


def commit_due_in(lakehouse: LakehouseResource, table_identifier: str, streams: list[StreamSpec]) -> float:
    """Seconds until ``commit_interval`` lets a writer run commit to the table (0: now)."""
    if lakehouse.until_idle:
        return 0.0
    return seconds_until_commit_due(lakehouse.lake().table(table_identifier), streams)


def commit_job(group: CommitGroup):  # -> UnresolvedAssetJobDefinition, not exported by dagster
    """Commit the group's ready staged batches (a router's pending routes, staged first), check
    each commit, and publish an audited table's commit when its checks pass. The sensor selects
    the tables that have work."""
    audits = any(group.audits(table) for table in group.tables)
    return dg.define_asset_job(
        group.commit_job_name,
        selection=group.committed_selection(),
        tags={RUN_KIND_TAG: "committer", names.PRIORITY_TAG: str(names.COMMITTER_PRIORITY)},
        description=f"Commit ready staged batches to {group.label}, check each commit"
        + (", and publish it when the checks pass." if audits else "."),
    )
