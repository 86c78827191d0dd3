"""The published asset of a ``publish: audit`` table (its main branch), the job that publishes it
after a fix, and the job that discards what its audit branch holds.

The committer's run materializes the table (a commit to the audit branch), evaluates its checks
on that snapshot, then materializes ``<table>/published``: Dagster skips it when a blocking check
failed, which fails the committer's step (in the publish job, the check step). It also verifies
the checks itself, in the instance, so materializing it on its own can never publish a snapshot
that was not checked.
"""

import dagster as dg

from lakehouse_assets.commit.publishing import PublishResult, discard_audited, publish_table
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.check_status import checks_not_passed
from lakehouse_assets.defs.checks import checked_target
from lakehouse_assets.defs.commit_reports import CommitFailures, report_commit
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.errors import DiscardRefusedError, FencedError, PublishRefusedError, TableMovedError


def published_asset(table_identifier: str, streams: list[StreamSpec]) -> dg.AssetsDefinition:
    """Main of ``table_identifier``: fast-forwarded to the audited snapshot once its checks passed."""
    table_key = names.table_key(table_identifier)

    @dg.asset(
        key=names.published_key(table_identifier),
        group_name=names.GROUP_NAME,
        deps=[table_key],
        kinds={"iceberg"},
        pool=names.commit_pool(table_identifier),
        output_required=False,
        description=(
            f"Main of {table_identifier}, what its readers see: moved to the audited snapshot only once "
            "every blocking check passed on it (no data rewritten)."
        ),
    )
    def published(context: dg.AssetExecutionContext, lakehouse: LakehouseResource, spark: SparkResource):
        target = checked_target(context.instance, lakehouse, table_identifier)
        snapshot = target.require_snapshot(table_identifier)
        not_passed = checks_not_passed(context.instance, table_identifier, streams, snapshot.snapshot_id)
        if not_passed:
            raise dg.Failure(
                description=(
                    f"{table_identifier}: snapshot {snapshot.snapshot_id} is not published: "
                    + "; ".join(f"{name} {found}" for name, found in not_passed.items())
                    + f". Fix, then run job {names.publish_job_name(table_identifier)}, or discard with "
                    f"`lakehouse audit discard --table {table_identifier}`"
                ),
                metadata={"snapshot_id": str(snapshot.snapshot_id), "checks": dg.JsonMetadataValue(not_passed)},
            )
        failures = CommitFailures()
        outcome: PublishResult | Exception | None
        try:
            outcome = spark.run(
                lakehouse.lake(), publish_table, table_identifier, snapshot.snapshot_id, context.run.run_id
            )
        except (PublishRefusedError, FencedError, TableMovedError) as refused:
            outcome = refused
        if outcome is None:
            context.log.info(f"{table_identifier}: main already has snapshot {snapshot.snapshot_id}")
            return
        yield from report_commit(context, lakehouse, table_identifier, streams, [], outcome, failures)
        failures.raise_any()

    return published


def publish_job(table_identifier: str):  # -> UnresolvedAssetJobDefinition, not exported by dagster
    """Runs the table's checks on its audited snapshot (the audit branch's head) again and publishes
    it when they pass: the way forward after fixing what made a check fail."""
    return dg.define_asset_job(
        names.publish_job_name(table_identifier),
        selection=dg.AssetSelection.checks_for_assets(names.table_key(table_identifier))
        | dg.AssetSelection.assets(names.published_key(table_identifier)),
        description=f"Check the audited snapshot of {table_identifier} again and publish it when every check passes.",
        executor_def=dg.in_process_executor,
        # The audited snapshot is read from the table, not from this instance's last materialization:
        # the commit may have been another host's.
        config={"resources": {"lakehouse": {"config": {"check_current_snapshot": True}}}},
    )


def discard_job(table_identifier: str) -> dg.JobDefinition:
    """Drops the audit branch's unpublished commits; their batches are staged again, with the
    configuration of that time, by the next committer run."""

    @dg.op(
        name=names.discard_op_name(table_identifier),
        pool=names.commit_pool(table_identifier),
        description=f"Point the audit branch of {table_identifier} back at main and stage its batches again.",
    )
    def discard(context: dg.OpExecutionContext, lakehouse: LakehouseResource, spark: SparkResource) -> None:
        try:
            result = spark.run(lakehouse.lake(), discard_audited, table_identifier)
        except (DiscardRefusedError, TableMovedError) as refused:
            raise dg.Failure(description=str(refused)) from None
        if result is None:
            context.log.info(f"{table_identifier}: the audit branch holds nothing unpublished; nothing to discard")
            return
        context.log.warning(
            f"{table_identifier}: discarded audited snapshot {result.discarded_snapshot_id}; batches "
            f"{result.batch_ranges} are staged again from their landing files by the next committer run"
        )
        context.log_event(
            dg.AssetObservation(
                asset_key=names.table_key(table_identifier),
                metadata={
                    "discarded_snapshot_id": str(result.discarded_snapshot_id),
                    "audit_branch_reset_to": str(result.main_snapshot_id or ""),
                    "batches_to_stage_again": dg.JsonMetadataValue(result.batch_ranges),
                },
            )
        )

    @dg.job(
        name=names.discard_job_name(table_identifier),
        description=(
            f"Discard the audited, unpublished commits of {table_identifier}: main is untouched, the batches "
            "are staged again from their landing files (after you fixed the configuration) and committed again."
        ),
        tags={names.TABLE_TAG: table_identifier},
    )
    def _job() -> None:
        discard()

    return _job
