"""Sensors: landing files -> writer runs (micro-batches), staged batches -> committer runs."""

import dagster as dg

from lakehouse_assets.batch_ledger import MintedBatch, StreamLedger
from lakehouse_assets.branches import audit_state
from lakehouse_assets.committer import plan_commit, seconds_until_commit_due
from lakehouse_assets.config import StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.assets import StagedBatchConfig
from lakehouse_assets.defs.publishing import failed_checks
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.micro_batching import mint_next_batch
from lakehouse_assets.recovery import committed_state
from lakehouse_assets.table_metadata import load_committed_table

MAX_BATCHES_PER_TICK = 16
SENSOR_DAEMON_LOOP_SECONDS = 5
"""The Dagster sensor daemon evaluates sensors at most this often, whatever their interval."""
IN_PROGRESS = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def writer_run_request(batch: MintedBatch) -> dg.RunRequest:
    """The run that stages ``batch``: run key ``<stream>:<sequence>``, exact files as typed config."""
    return dg.RunRequest(
        run_key=f"{batch.stream}:{batch.sequence}",
        run_config=dg.RunConfig(
            ops={names.staged_batches_op(batch.stream): StagedBatchConfig(sequence=batch.sequence, files=batch.files)}
        ),
        tags={names.STREAM_TAG: batch.stream, names.SEQUENCE_TAG: str(batch.sequence)},
    )


def landing_sensor_interval(stream: StreamSpec) -> int:
    """Seconds between ticks of the stream's landing sensor: a third of ``flush.max_age``, so an
    aged batch is cut soon after it is due, between the daemon's 5 s loop and 30 s."""
    return int(min(max(stream.flush.max_age / 3, SENSOR_DAEMON_LOOP_SECONDS), 30))


def landing_sensor(stream: StreamSpec) -> dg.SensorDefinition:
    """Cuts micro-batches of ``stream`` with the dual trigger and requests one writer run each.

    Minted batches that are not staged yet are requested again every tick under the same run
    key, so a lost request or a cursor moved back deduplicates instead of skipping a batch.
    While one batch waits for its writer run, no other is cut: the events that land meanwhile go
    into the next batch, so under load batches grow instead of runs piling up in the queue, and
    each writer run pays its process and JVM start for as many events as arrived during the last.
    """

    @dg.sensor(
        name=names.landing_sensor_name(stream.name),
        job_name=names.stage_job_name(stream.name),
        minimum_interval_seconds=landing_sensor_interval(stream),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Cuts batches of `{stream.name}` when flush.max_bytes or flush.max_age is reached.",
    )
    def _sensor(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource) -> dg.SensorResult | dg.SkipReason:
        config, paths = lakehouse.config(), lakehouse.paths()
        current = config.stream(stream.name)
        ledger = StreamLedger(paths.staging(stream.name))
        # A router's batch is done once routed and its unroutable events committed, not when staged.
        unfinished = [r for r in ledger.batches() if (r.committed if current.is_router else r.staged) is None]
        requests = [writer_run_request(r.minted) for r in unfinished]
        if unfinished and not lakehouse.until_idle:
            # Requested again under its run key (the daemon launches a run key once): events
            # landing meanwhile wait for the next batch.
            return dg.SensorResult(run_requests=requests, cursor=context.cursor)
        reason = "no minted batch waits for staging"
        for _ in range(MAX_BATCHES_PER_TICK):
            batch, reason = mint_next_batch(config, paths, current, drain=lakehouse.until_idle)
            if batch is None:
                break
            requests.append(writer_run_request(batch))
        if not requests:
            return dg.SkipReason(reason)
        return dg.SensorResult(
            run_requests=requests,
            cursor=str(max(int(r.tags[names.SEQUENCE_TAG]) for r in requests)),
        )

    return _sensor


def staged_batches_sensor(table_identifier: str, streams: list[StreamSpec]) -> dg.SensorDefinition:
    """Requests a committer run when staged batches are ready and ``commit_interval`` has passed."""

    @dg.sensor(
        name=names.staged_sensor_name(table_identifier),
        job_name=names.commit_job_name(table_identifier),
        minimum_interval_seconds=5,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Launches the committer of {table_identifier} when staged batches are ready.",
    )
    def _sensor(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource) -> dg.RunRequest | dg.SkipReason:
        config, paths = lakehouse.config(), lakehouse.paths()
        table = load_committed_table(config, paths, table_identifier)
        ready: dict[str, int] = {}
        state = audit_state(table) if config.audits(table_identifier) else None
        if state and state.awaiting_publish:
            failed = failed_checks(context.instance, table_identifier, streams, state.audit)
            if failed:
                return dg.SkipReason(
                    f"publishing stopped: {', '.join(failed)} failed on audited snapshot {state.audit}; fix and run "
                    f"{names.publish_job_name(table_identifier)}, or discard (`lakehouse audit discard`)"
                )
            ready["audit branch, to check and publish"] = len(state.unpublished)
        for stream in streams:
            ledger = StreamLedger(paths.staging(stream.name))
            plan = plan_commit(ledger, stream.name, committed_state(table, stream.name).sequence)
            if plan.ready or plan.recovered:
                ready[stream.name] = len(plan.ready)
        if not ready:
            return dg.SkipReason("no staged batches are ready to commit")
        if lakehouse.until_idle:
            return dg.RunRequest(tags={names.TABLE_TAG: table_identifier})
        wait = seconds_until_commit_due(table, streams)
        if wait > 0:
            return dg.SkipReason(f"commit_interval: {wait:.1f}s until the next commit")
        # Committers are serialised by the table lock and fence each other, so this only avoids
        # piling up runs; dagster.yaml's run monitoring fails runs whose process died. A writer run
        # in progress commits what is staged itself once it has staged its batch.
        for job_name in [names.commit_job_name(table_identifier), *(names.stage_job_name(s.name) for s in streams)]:
            busy = context.instance.get_runs(filters=dg.RunsFilter(job_name=job_name, statuses=IN_PROGRESS), limit=1)
            if busy:
                return dg.SkipReason(f"run {busy[0].run_id} of {job_name} is in progress and commits when it can")
        summary = ", ".join(f"{name}: {count} batches" for name, count in ready.items())
        return dg.RunRequest(tags={names.TABLE_TAG: table_identifier, "lakehouse/ready": summary})

    return _sensor
