"""Sensors: landing files -> writer runs (micro-batches); staged batches or route files -> a
committer run of their commit group."""

import time
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import dagster as dg

from lakehouse_assets.batches.ledger import COMMITTED_FILE, STAGED_FILE, MintedBatch
from lakehouse_assets.commit.branches import audit_state
from lakehouse_assets.commit.committer import plan_commit, seconds_until_commit_due
from lakehouse_assets.commit.recovery import committed_state
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.assets import StagedBatchConfig
from lakehouse_assets.defs.check_status import failed_checks
from lakehouse_assets.defs.commit_groups import CommitGroup
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.engine.spark_host import start_in_background
from lakehouse_assets.ingest.fan_in import tables_with_pending_routes
from lakehouse_assets.ingest.micro_batching import NO_PENDING_EVENTS, mint_next_batch
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.runtime.run_failures import recorded_failure
from lakehouse_assets.runtime.run_states import FAILED, UNFINISHED
from lakehouse_assets.storage_space import storage_failure

MAX_BATCHES_PER_TICK = 16
MAX_TAG_CHARS = 1000
"""A run tag's value is cut to this length: a router's run for hundreds of tables names them all otherwise."""
SENSOR_DAEMON_LOOP_SECONDS = 5
"""The Dagster sensor daemon evaluates sensors at most this often, whatever their interval."""
WRITER_RETRY_BACKOFF_SECONDS = 5.0
WRITER_RETRY_BACKOFF_CAP_SECONDS = 60.0
RETRY_LAUNCH_GRACE_SECONDS = 60.0
"""A failed run that Dagster said it would retry, with no retry launched this long after, counts as
not retried (the daemon that would have launched it may have died)."""


def run_in_progress(instance: dg.DagsterInstance, job_names: list[str]) -> dg.DagsterRun | None:
    """A queued or running run of one of the jobs, or None."""
    for job_name in job_names:
        runs = instance.get_runs(filters=dg.RunsFilter(job_name=job_name, statuses=list(UNFINISHED)), limit=1)
        if runs:
            return runs[0]
    return None


def writer_run_request(batch: MintedBatch, retry: int = 0, reason: str | None = None) -> dg.RunRequest:
    """The run that stages ``batch``: run key ``<stream>:<sequence>`` (``...:retry-<n>`` when the
    sensor requests it again after a failure), exact files as typed config."""
    tags = {names.STREAM_TAG: batch.stream, names.SEQUENCE_TAG: str(batch.sequence)}
    if retry:
        tags[names.WRITER_RETRY_TAG] = str(retry)
    if reason:
        tags[names.WRITER_RETRY_REASON_TAG] = reason
    return dg.RunRequest(
        run_key=f"{batch.stream}:{batch.sequence}" + (f":retry-{retry}" if retry else ""),
        run_config=dg.RunConfig(
            ops={names.staged_batches_op(batch.stream): StagedBatchConfig(sequence=batch.sequence, files=batch.files)}
        ),
        tags=tags,
    )


def writer_retry_backoff(retry: int) -> float:
    """Seconds between a writer run failing for good and the sensor's request ``retry`` (1, 2, ...):
    5 s, doubling per retry, at most a minute: a stream whose runtime healed resumes within a
    minute, and a batch that fails for a cause of its own is tried once a minute until fixed."""
    return min(WRITER_RETRY_BACKOFF_SECONDS * 2 ** (retry - 1), WRITER_RETRY_BACKOFF_CAP_SECONDS)


def _retries_exhausted(instance: dg.DagsterInstance, run: dg.DagsterRun, failed_at: float, now: float) -> bool:
    """Whether Dagster will launch no retry of this failed run: run retries are off, or Dagster
    tagged it ``dagster/will_retry=false``, or said it would and has not for
    ``RETRY_LAUNCH_GRACE_SECONDS``, or (not tagged yet) its retry number reached the maximum."""
    if not instance.run_retries_enabled:
        return True
    will_retry = run.tags.get(names.WILL_RETRY_TAG)
    if will_retry is not None:
        return will_retry.lower() != "true" or now > failed_at + RETRY_LAUNCH_GRACE_SECONDS
    try:
        max_retries = int(run.tags.get(names.MAX_RETRIES_TAG, instance.run_retries_max_retries))
        return int(run.tags.get(names.RETRY_NUMBER_TAG, "0")) >= max_retries
    except ValueError:
        return True


def committer_backoff(instance: dg.DagsterInstance, job_name: str, now: float | None = None) -> str | None:
    """Why not to request a committer job yet: its last runs failed (a table that fails for good,
    such as a gap, would otherwise fail a run every tick); None when a run may start. Waits 5 s
    after one failure, doubling per consecutive failure up to a minute (``writer_retry_backoff``).
    The one backoff of every committer sensor, a table's and a router's."""
    records = instance.get_run_records(filters=dg.RunsFilter(job_name=job_name), limit=10)
    failures = 0
    for record in records:
        if record.dagster_run.status not in FAILED:
            break
        failures += 1
    if not failures:
        return None
    failed_at = records[0].end_time or records[0].update_timestamp.timestamp()
    retry_at = failed_at + writer_retry_backoff(failures)
    remaining = retry_at - (time.time() if now is None else now)
    if remaining <= 0:
        return None
    latest = records[0].dagster_run.run_id
    return (
        f"the last {failures} runs of {job_name} failed (latest {latest}{_because(instance, latest)}); "
        f"requesting the tables again in {remaining:.0f}s"
    )


def _because(instance: dg.DagsterInstance, run_id: str) -> str:
    """``: <why the run failed>`` (``run_failures.recorded_failure``), or nothing when no step failed."""
    reason = recorded_failure(instance, run_id, LakehousePaths.from_env().written_directories())
    return f": {reason}" if reason else ""


class UnstagedBatch(NamedTuple):
    """What the landing sensor does about a minted batch that is not staged yet."""

    request: dg.RunRequest | None
    note: str | None
    """What the tick says of it (None when all is well)."""
    failed: bool = False
    """Its writer run failed past Dagster's retries: the note is also a warning in the log."""


def unstaged_batch_request(instance: dg.DagsterInstance, batch: MintedBatch, now: float) -> UnstagedBatch:
    """The request for a minted batch that is not staged yet, under the sensor daemon, and what to
    tell the operator on the tick. No request while the batch's latest writer run is queued or in
    progress: the note names it.

    The daemon launches a run key once and Dagster retries a failed run at most ``max_retries``
    times, so the batch is requested under the run key of its latest attempt (a duplicate the
    daemon skips) until that attempt's runs failed for good; then, once the backoff since the
    failure has passed, under a new run key ``<stream>:<sequence>:retry-<n>``. While it backs off
    there is no request, and the note says which run failed and when the batch is requested again.
    """
    records = instance.get_run_records(
        filters=dg.RunsFilter(tags={names.STREAM_TAG: batch.stream, names.SEQUENCE_TAG: str(batch.sequence)}),
        limit=1,
    )
    latest = records[0].dagster_run if records else None
    retry = int(latest.tags.get(names.WRITER_RETRY_TAG, "0")) if latest else 0
    if latest is None:
        return UnstagedBatch(writer_run_request(batch, retry), None)
    if latest.status in UNFINISHED:
        # The daemon would skip the request as a run key already used, and the tick would say
        # "0 runs requested" with the reason in the daemon's log only.
        waiting = f"batch {batch.stream}:{batch.sequence} waits for writer run {latest.run_id} ({latest.status.value})"
        return UnstagedBatch(None, waiting)
    failed_at = records[0].end_time or records[0].update_timestamp.timestamp()
    if latest.status not in FAILED or not _retries_exhausted(instance, latest, failed_at, now):
        return UnstagedBatch(writer_run_request(batch, retry), None)
    backoff = writer_retry_backoff(retry + 1)
    failure = (
        f"batch {batch.stream}:{batch.sequence}: writer run {latest.run_id} failed"
        f"{_because(instance, latest.run_id)}; Dagster will not retry it"
    )
    if now < failed_at + backoff:
        when = f"in {failed_at + backoff - now:.0f}s ({backoff:.0f}s after the failure)"
        return UnstagedBatch(None, f"{failure}; requesting the batch again (retry {retry + 1}) {when}", failed=True)
    reason = f"{failure}; requested again (retry {retry + 1}) {backoff:.0f}s after the failure"
    return UnstagedBatch(writer_run_request(batch, retry + 1, reason), reason, failed=True)


Tick = TypeVar("Tick")


def _skipped_while_full(lakehouse: LakehouseResource, tick: Callable[[], Tick]) -> Tick | dg.SkipReason:
    """The tick's result, or, under the daemon, when a file system refused one of its writes (a
    batch's record), a skip naming the path and its free space: the next tick tries again.
    ``lakehouse run --until-idle`` stops on the error instead (with its one line), not idle."""
    if lakehouse.until_idle:
        return tick()
    try:
        return tick()
    except OSError as error:
        full = storage_failure(error, "the sensor's tick", LakehousePaths.from_env().written_directories())
        if full is None:
            raise
        return dg.SkipReason(f"{full}; the next tick tries again")


def landing_sensor_interval(stream: StreamSpec) -> int:
    """Seconds between ticks of the stream's landing sensor: a third of ``flush.max_age``, so an
    aged batch is cut soon after it is due, between the daemon's 5 s loop and 30 s."""
    return int(min(max(stream.flush.max_age / 3, SENSOR_DAEMON_LOOP_SECONDS), 30))


def _start_spark_host_early(context: dg.SensorEvaluationContext, lake: Lakehouse) -> None:
    """Events are coming: start the home's Spark host now (``spark_host.start_early``), so the
    writer run finds its JVM started instead of starting it. Best effort: the run starts the host
    itself otherwise, and reports why it cannot."""
    if not (lake.config.spark_host.enabled and lake.config.spark_host.start_early):
        return
    try:
        start_in_background(lake)
    except Exception as error:  # noqa: BLE001 - never let an optimisation hold back the tick's requests
        context.log.warning(f"could not start the Spark host early ({error}); the writer run will start it")


def landing_sensor(stream: StreamSpec) -> dg.SensorDefinition:
    """Cuts micro-batches of ``stream`` with the dual trigger and requests one writer run each.

    Minted batches that are not staged yet are requested again every tick under the same run
    key, so a lost request or a cursor moved back deduplicates instead of skipping a batch; a batch
    whose writer run failed past Dagster's retries is requested again under a new run key after a
    backoff (``unstaged_batch_request``), and the tick says so.
    While one batch waits for its writer run, no other is cut: the events that land meanwhile go
    into the next batch, so under load batches grow instead of runs piling up in the queue, and
    each writer run pays its process start for as many events as arrived during the last. A tick
    that sees events coming starts the Spark host, so the first batch does not wait for its JVM.
    """

    @dg.sensor(
        name=names.landing_sensor_name(stream.name),
        job_name=names.stage_job_name(stream.name),
        minimum_interval_seconds=landing_sensor_interval(stream),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Cuts batches of `{stream.name}` when flush.max_bytes or flush.max_age is reached.",
    )
    def _sensor(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource) -> dg.SensorResult | dg.SkipReason:
        return _skipped_while_full(lakehouse, lambda: _landing_tick(context, lakehouse, stream))

    return _sensor


def _landing_tick(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource, stream: StreamSpec
) -> dg.SensorResult | dg.SkipReason:
    """One tick of ``landing_sensor``."""
    lake = lakehouse.lake()
    current = lake.stream(stream.name)
    ledger = lake.ledger(stream.name)
    # A router's batch is done once routed and its unroutable events committed, not when staged.
    unfinished = [
        record
        for record in ledger.batches(lacking=COMMITTED_FILE if current.is_router else STAGED_FILE)
        if (record.committed if current.is_router else record.staged) is None
    ]
    if unfinished and not lakehouse.until_idle:
        # Requested again under its attempt's run key (the daemon launches a run key once), or
        # under a new one after a failure Dagster retries no more: events landing meanwhile
        # wait for the next batch.
        now, requests, notes = time.time(), [], []
        for record in unfinished:
            request, note, failed = unstaged_batch_request(context.instance, record.minted, now)
            requests += [request] if request else []
            notes += [note] if note else []
            if failed:
                context.log.warning(note)
        if not requests:
            return dg.SkipReason("; ".join(notes))
        _start_spark_host_early(context, lake)
        return dg.SensorResult(run_requests=requests, cursor=context.cursor)
    # ``lakehouse run --until-idle`` runs every request itself and repeats a failed one.
    requests = [writer_run_request(r.minted) for r in unfinished]
    reason = "no minted batch waits for staging"
    for _ in range(MAX_BATCHES_PER_TICK):
        batch, reason = mint_next_batch(lake, current, drain=lakehouse.until_idle)
        if batch is None:
            break
        requests.append(writer_run_request(batch))
    if not lakehouse.until_idle and (requests or reason != NO_PENDING_EVENTS):
        _start_spark_host_early(context, lake)
    if not requests:
        return dg.SkipReason(reason)
    return dg.SensorResult(
        run_requests=requests,
        cursor=str(max(int(r.tags[names.SEQUENCE_TAG]) for r in requests)),
    )


def committer_sensor(group: CommitGroup) -> dg.SensorDefinition:
    """Requests one committer run for the group's tables that have work and whose
    ``commit_interval`` has passed, selecting just those tables; none while a writer or committer
    run of the group is in progress (it commits them), nor during a backoff after failed runs."""

    @dg.sensor(
        name=group.sensor_name,
        job_name=group.commit_job_name,
        minimum_interval_seconds=5,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Launches the committer of {group.label} when there is something to commit.",
    )
    def _sensor(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource) -> dg.RunRequest | dg.SkipReason:
        return _skipped_while_full(lakehouse, lambda: _committer_tick(context, lakehouse, group))

    return _sensor


def _committer_tick(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource, group: CommitGroup
) -> dg.RunRequest | dg.SkipReason:
    """One tick of ``committer_sensor``."""
    lake = lakehouse.lake()
    work = _committer_work(context.instance, lake, group)
    if isinstance(work, dg.SkipReason):
        return work
    due = list(work)
    if not lakehouse.until_idle:
        # Committers are serialised by the table locks and fence each other, so this only
        # avoids piling up runs; dagster.yaml's run monitoring fails runs whose process died.
        # A writer run in progress commits what is staged itself once it has staged its batch.
        busy = run_in_progress(context.instance, [group.commit_job_name, *group.writer_job_names])
        if busy:
            return dg.SkipReason(f"run {busy.run_id} of {busy.job_name} is in progress and commits when it can")
        backoff = committer_backoff(context.instance, group.commit_job_name)
        if backoff:
            return dg.SkipReason(backoff)
        waits = {table: seconds_until_commit_due(lake.table(table), group.tables[table]) for table in work}
        due = [table for table, wait in waits.items() if wait <= 0]
        if not due:
            return dg.SkipReason(f"commit_interval: {min(waits.values()):.1f}s until the next commit is due")
    summary = "; ".join(f"{table}: {what}" for table, what in work.items() if table in due)
    return dg.RunRequest(
        asset_selection=group.committed_keys(due),
        asset_check_keys=[],  # the run evaluates the checks of what it commits (``defs.committer``)
        tags=group.run_tags(due) | {"lakehouse/ready": summary[:MAX_TAG_CHARS]},
    )


def _committer_work(
    instance: dg.DagsterInstance, lake: Lakehouse, group: CommitGroup
) -> dict[str, str] | dg.SkipReason:
    """Per table of the group with something to commit, what; or why there is nothing. A router's
    tables have work when route files wait for them (``fan_in.tables_with_pending_routes``);
    another table when a stream has staged batches ready, or its audit branch holds a snapshot to
    check and publish (not while a check failed on it: that waits for the operator)."""
    if group.router:
        pending = tables_with_pending_routes(lake.paths, group.router, list(group.tables))
        return {table: "routes" for table in pending} or dg.SkipReason("no routed table has routes to commit")
    table_identifier = group.only_table
    streams = group.tables[table_identifier]
    table = lake.table(table_identifier)
    ready: dict[str, int] = {}
    state = audit_state(table) if lake.config.audits(table_identifier) else None
    if state and state.awaiting_publish:
        failed = failed_checks(instance, table_identifier, streams, state.audit)
        if failed:
            return dg.SkipReason(
                f"publishing stopped: {', '.join(failed)} failed on audited snapshot {state.audit}; fix and run "
                f"{names.publish_job_name(table_identifier)}, or discard (`lakehouse audit discard`)"
            )
        ready["audit branch, to check and publish"] = len(state.unpublished)
    for stream in streams:
        ledger = lake.ledger(stream.name)
        plan = plan_commit(ledger, stream.name, committed_state(table, stream.name).sequence)
        if plan.ready or plan.recovered:
            ready[stream.name] = len(plan.ready)
    if not ready:
        return dg.SkipReason("no staged batches are ready to commit")
    return {table_identifier: ", ".join(f"{name}: {count} batches" for name, count in ready.items())}
