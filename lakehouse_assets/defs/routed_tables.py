"""The tables one router feeds, driven together: one multi-asset, job and sensor per router.

Each routed table stays its own asset, with its commits, checks and lineage in the UI, but the
work of a cycle is fanned in: one step stages the routes of every table that has some and
commits each table in its own Iceberg commit (its own summary keys, fence and checks), in one
process and one Spark session. A database of 500 tables is one sensor and one run per cycle, not
1,000 sensors and a run per table. A table whose commit or check fails is reported on that table;
the others go on, and the step fails at the end naming it.
"""

from collections.abc import Iterator
from functools import partial

import dagster as dg

from lakehouse_assets.commit.committer import CommitOutcome, commit_table, seconds_until_commit_due
from lakehouse_assets.config import StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.assets import commit_due_in, report_commit_pass, run_ranges, sequence_gap_evaluation
from lakehouse_assets.defs.check_status import blocking_check_names
from lakehouse_assets.defs.checks import CheckTarget, TableCheck, checked_target, table_check_registry
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.defs.sensors import committer_backoff, run_in_progress
from lakehouse_assets.errors import SequenceGapError, describe_error
from lakehouse_assets.fan_in import commit_concurrently, stage_routed_tables, tables_with_pending_routes
from lakehouse_assets.quality import checks


class RoutedTablesConfig(dg.Config):
    """Which routed tables a run works on: by default every table it selects."""

    tables: list[str] = []


def routed_tables_asset(router: StreamSpec, tables: dict[str, list[StreamSpec]]) -> dg.AssetsDefinition:
    """The committer of every table ``router`` feeds: stages their pending routes, commits each
    table with ready batches and runs its checks on the snapshot it committed; with only checks
    selected (``lakehouse check``, the freshness job), checks the tables' current snapshots."""
    registry = {table: table_check_registry(table, streams) for table, streams in tables.items()}
    keys = {names.table_key(table): table for table in tables}

    @dg.multi_asset(
        name=names.routed_tables_op(router.name),
        specs=[
            dg.AssetSpec(
                names.table_key(table),
                deps=[names.staged_batches_key(router.name)],
                group_name=names.GROUP_NAME,
                kinds={"iceberg", "spark"},
                skippable=True,
                description=f"Iceberg table {table}, routed by stream `{router.name}`; one materialization per commit.",
            )
            for table in tables
        ],
        check_specs=[
            dg.AssetCheckSpec(
                check.name, asset=names.table_key(table), blocking=check.blocking, description=check.description
            )
            for table, table_checks in registry.items()
            for check in table_checks
        ],
        can_subset=True,
        pool=names.routed_commit_pool(router.name),
    )
    def routed_tables(
        context: dg.AssetExecutionContext,
        config: RoutedTablesConfig,
        lakehouse: LakehouseResource,
        spark: SparkResource,
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckResult]:
        unknown = sorted(set(config.tables) - set(tables))
        if unknown:
            raise dg.Failure(f"tables: {', '.join(unknown)} are not routed by stream {router.name}")
        wanted = set(config.tables) or set(tables)
        selected = [keys[key] for key in sorted(context.selected_asset_keys) if keys[key] in wanted]
        failed: list[str] = []
        if selected:
            yield from _stage_commit_and_check(context, lakehouse, spark, router, tables, registry, selected, failed)
        # Only checks selected (a check or freshness job, or the UI): as a table's asset checks do.
        selected_checks = set(context.selected_asset_check_keys)
        for key in sorted({check.asset_key for check in selected_checks} - set(context.selected_asset_keys)):
            if keys[key] not in wanted:
                continue
            target = partial(checked_target, context.instance, lakehouse, keys[key])
            for check in registry[keys[key]]:
                if dg.AssetCheckKey(key, check.name) in selected_checks:
                    yield check.result(key, lakehouse, target)
        if failed:
            raise dg.Failure(f"{len(failed)} routed tables failed: " + "; ".join(failed))

    return routed_tables


def _stage_commit_and_check(
    context: dg.AssetExecutionContext,
    lakehouse: LakehouseResource,
    spark: SparkResource,
    router: StreamSpec,
    tables: dict[str, list[StreamSpec]],
    registry: dict[str, list[TableCheck]],
    selected: list[str],
    failed: list[str],
) -> Iterator[dg.MaterializeResult]:
    """Stage and commit the selected tables that have work, each on its own, and log each commit's
    checks; appends to ``failed`` the tables whose staging or commit failed or whose blocking check
    did not pass."""
    lake = lakehouse.lake()
    pending = tables_with_pending_routes(lake.paths, router, selected)
    if not pending:
        context.log.info(f"none of the {len(selected)} selected tables has routes to commit")
        return
    not_staged = spark.run(lake, stage_routed_tables, router, pending, context.run.run_id)
    for table, error in not_staged.items():
        context.log.error(f"{table}: staging failed: {error}")
        failed.append(f"{table}: {error}")
    context.log.info(f"staged the routes of {len(pending) - len(not_staged)} tables; committing them")
    on_commit_job = context.job_name == names.routed_commit_job_name(router.name)
    waits = {
        table: 0.0 if on_commit_job else commit_due_in(lakehouse, table, tables[table])
        for table in pending
        if table not in not_staged
    }
    due = [table for table, wait in waits.items() if wait <= 0]
    if len(due) < len(waits):
        context.log.info(
            f"commit_interval: {len(waits) - len(due)} tables are not due yet (the first in "
            f"{min(wait for wait in waits.values() if wait > 0):.1f}s); the committer run commits them then"
        )
    commit = partial(spark.run, lake, commit_table, run_id=context.run.run_id)
    # Each table is reported as soon as its commit is done, while the next ones commit.
    for table, outcome in commit_concurrently(commit, due):
        try:
            yield from _report_commit(context, lakehouse, table, tables[table], registry[table], outcome, failed)
        except Exception as error:  # noqa: BLE001 - one table's report must not lose the others'
            context.log.error(f"{table}: reporting its commit failed: {describe_error(error)}")
            failed.append(f"{table}: {error}")


def _report_commit(
    context: dg.AssetExecutionContext,
    lakehouse: LakehouseResource,
    table: str,
    streams: list[StreamSpec],
    table_checks: list[TableCheck],
    outcome: CommitOutcome | Exception,
    failed: list[str],
) -> Iterator[dg.MaterializeResult]:
    """Report one table's committer pass: its commits as materializations and its checks on the
    snapshot it committed; appends to ``failed`` when the commit raised or a blocking check failed."""
    key = names.table_key(table)
    if isinstance(outcome, SequenceGapError):
        failed.append(f"{table}: {outcome}")
        context.log_event(sequence_gap_evaluation(key, outcome))
        return
    if isinstance(outcome, Exception):
        context.log.error(f"{table}: commit failed: {describe_error(outcome)}")
        failed.append(f"{table}: {outcome}")
        return
    materialization = report_commit_pass(context, lakehouse, table, streams, outcome)
    if materialization is None:
        return
    last = outcome.results[-1]
    target = CheckTarget(checks.CommittedSnapshot(last.metadata_location, last.snapshot_id), run_ranges(outcome))
    yield materialization
    # The checks are logged rather than planned with the run: planning a check is an event per
    # check and table at run creation, which for hundreds of tables cost more than the checks.
    for check in table_checks:
        result = check.result(key, lakehouse, target)
        context.log_event(
            dg.AssetCheckEvaluation(
                asset_key=key,
                check_name=check.name,
                passed=result.passed,
                metadata=result.metadata,
                severity=result.severity,
                description=result.description,
            )
        )
        if check.blocking and not result.passed:
            failed.append(f"{table}: check {check.name} failed: {result.description}")


def routed_tables_keys(tables: dict[str, list[StreamSpec]]) -> dg.AssetSelection:
    """The router's tables without their checks: a committing run logs each table's check results
    itself, for the tables it committed."""
    return dg.AssetSelection.assets(*(names.table_key(table) for table in tables)).without_checks()


def routed_commit_job(router: StreamSpec, tables: dict[str, list[StreamSpec]]):  # -> UnresolvedAssetJobDefinition
    """Commit the router's tables that have routes (the sensor selects them), with their checks."""
    return dg.define_asset_job(
        names.routed_commit_job_name(router.name),
        selection=routed_tables_keys(tables),
        tags={names.RUN_KIND_TAG: "committer", names.PRIORITY_TAG: str(names.COMMITTER_PRIORITY)},
        description=f"Stage and commit the routes of stream {router.name} to each of its tables; check each commit.",
    )


def routed_check_job(router: StreamSpec, tables: dict[str, list[StreamSpec]]):
    """The blocking checks of the router's tables on their current snapshots (``lakehouse check``;
    run config ``tables`` narrows it)."""
    return dg.define_asset_job(
        names.routed_check_job_name(router.name),
        selection=dg.AssetSelection.checks(
            *(
                dg.AssetCheckKey(names.table_key(table), name)
                for table, streams in tables.items()
                for name in blocking_check_names(streams)
            )
        ),
        config={"resources": {"lakehouse": {"config": {"check_current_snapshot": True}}}},
        tags={names.RUN_KIND_TAG: "check"},
        description=f"Run the blocking checks of the tables {router.name} routes to, on their current snapshots.",
    )


def routed_freshness_job(router: StreamSpec, tables: dict[str, list[StreamSpec]]):
    """The freshness check of every table the router feeds, in one run."""
    return dg.define_asset_job(
        names.routed_freshness_job_name(router.name),
        selection=dg.AssetSelection.checks(
            *(dg.AssetCheckKey(names.table_key(table), names.FRESHNESS_CHECK) for table in tables)
        ),
        tags={names.RUN_KIND_TAG: "freshness", names.PRIORITY_TAG: str(names.BACKGROUND_PRIORITY)},
        description=f"Evaluate {names.FRESHNESS_CHECK} of every table stream {router.name} routes to.",
    )


def routed_tables_sensor(router: StreamSpec, tables: dict[str, list[StreamSpec]]) -> dg.SensorDefinition:
    """Requests one committer run for the router's tables that have routes to commit and whose
    ``commit_interval`` has passed, selecting just those tables; none while the router's writer or
    committer run is in progress (it commits them), nor during a backoff after failed runs."""

    @dg.sensor(
        name=names.routed_sensor_name(router.name),
        job_name=names.routed_commit_job_name(router.name),
        minimum_interval_seconds=5,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Launches the committer of the tables stream {router.name} routes to when they have routes.",
    )
    def _sensor(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource) -> dg.RunRequest | dg.SkipReason:
        lake = lakehouse.lake()
        pending = tables_with_pending_routes(lake.paths, router, list(tables))
        if not pending:
            return dg.SkipReason("no routed table has routes to commit")
        if not lakehouse.until_idle:
            jobs = [names.routed_commit_job_name(router.name), names.stage_job_name(router.name)]
            busy = run_in_progress(context.instance, jobs)
            if busy:
                return dg.SkipReason(f"run {busy.run_id} of {busy.job_name} is in progress and commits the routes")
            waiting = committer_backoff(context.instance, names.routed_commit_job_name(router.name))
            if waiting:
                return dg.SkipReason(waiting)
            waits = {table: seconds_until_commit_due(lake.table(table), tables[table]) for table in pending}
            pending = [table for table, wait in waits.items() if wait <= 0]
            if not pending:
                return dg.SkipReason(f"commit_interval: {min(waits.values()):.1f}s until the next commit is due")
        return dg.RunRequest(
            asset_selection=[names.table_key(table) for table in pending],
            asset_check_keys=[],  # the run logs the checks of what it commits (see routed_tables_keys)
            tags={names.STREAM_TAG: router.name, "lakehouse/tables": str(len(pending))},
        )

    return _sensor
