"""``lakehouse run --until-idle``: evaluate the sensors and execute the runs they request, in-process.

Runs go through the same Dagster definitions and are recorded in the Dagster instance, so
``dagster dev`` on the same ``DAGSTER_HOME`` shows their materializations and check results. The
sensors run with ``until_idle`` set: every pending event is cut into batches, whatever the flush
triggers say, so "idle" means nothing is pending.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import dagster as dg

from lakehouse_assets.config.loader import load_config
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.runtime.instance_settings import dagster_home, ensure_instance_settings
from lakehouse_assets.runtime.run_failures import failure_line, first_line, op_errors
from lakehouse_assets.runtime.run_liveness import LIVENESS_TAG, RunProcess, release_run_lock, run_process
from lakehouse_assets.runtime.run_states import LAUNCHED
from lakehouse_assets.storage_space import StorageFullError, StorageRefusedError, storage_failure

RUN_KEY_TAG = "dagster/run_key"
SENSOR_NAME_TAG = "dagster/sensor_name"
# Runs executed here keep one Spark JVM in this process rather than use the Spark host.
IN_PROCESS_SPARK = {"spark": {"config": {"use_host": False}}}
UNTIL_IDLE_RESOURCES = {"lakehouse": {"config": {"until_idle": True}}}


@dg.logger(config_schema={}, description="The console of runs executed in this process: their warnings")
def warnings_console(_context: dg.InitLoggerContext) -> logging.Logger:
    """Step-by-step events still go to the instance (and the UI); the console shows warnings. A
    failed run is the caller's one line (``failure_line``) instead of Dagster's error events, each
    of which repeats the whole chain of errors with their stack traces."""
    console = logging.Logger("lakehouse.runs", logging.WARNING)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s - %(levelname)s - %(message)s"))
    console.addHandler(handler)
    console.addFilter(lambda record: record.levelno < logging.ERROR)
    return console


@dataclass
class IdleRunReport:
    """The runs executed until idle, and the ones that failed."""

    succeeded: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def _already_done(instance: dg.DagsterInstance, sensor_name: str, run_key: str) -> bool:
    """True when a run with this run key succeeded.

    Unlike the sensor daemon, which skips any run key it has seen, this runner re-executes a
    request whose earlier run failed or died (a crashed ``lakehouse run`` leaves its run STARTED
    for ever): the runs are idempotent, so repeating one is safe and skipping one would stall
    its stream.
    """
    runs = instance.get_runs(
        filters=dg.RunsFilter(
            tags={RUN_KEY_TAG: run_key, SENSOR_NAME_TAG: sensor_name}, statuses=[dg.DagsterRunStatus.SUCCESS]
        ),
        limit=1,
    )
    return bool(runs)


def fail_runs_of_dead_processes(instance: dg.DagsterInstance, log: Callable[[str], None] = print) -> list[str]:
    """Mark runs whose process is gone (their liveness lock is free) as failed.

    A killed process leaves its run STARTED and, worse, keeps the concurrency-pool slot its
    committer step claimed, so every later committer of that table would wait for ever. Under
    ``dagster dev`` and the daemon, run monitoring does the same through the project's run
    launcher; this runner does it before it executes anything, without the daemon.
    """
    failed = []
    in_progress = instance.get_runs(filters=dg.RunsFilter(statuses=list(LAUNCHED)))
    for run in in_progress:
        lock = run.tags.get(LIVENESS_TAG)
        if run_process(lock) is RunProcess.GONE:
            message = f"the process that ran it is gone (its liveness lock {lock} is free)"
            instance.report_run_failed(run, message=message)
            instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
            failed.append(run.run_id)
            log(f"marked run {run.run_id} failed: its process is gone")
    return failed


def run_job(
    job: dg.JobDefinition,
    instance: dg.DagsterInstance,
    run_config: dict | None = None,
    tags: dict[str, str] | None = None,
    asset_selection: Sequence[dg.AssetKey] | None = None,
    asset_check_selection: Sequence[dg.AssetCheckKey] | None = None,
) -> dg.ExecuteInProcessResult:
    """Execute ``job`` (only ``asset_selection`` of it and ``asset_check_selection`` of their checks,
    when given; all their checks when it is None) in this process, recorded in ``instance`` and
    after failing the runs of dead processes (which would hold its pool slot for ever). The run's
    liveness lock is released once it returns: this process goes on to other runs."""
    fail_runs_of_dead_processes(instance)
    if asset_selection is not None:
        checks = None if asset_check_selection is None else set(asset_check_selection)
        job = job.get_subset(asset_selection=set(asset_selection), asset_check_selection=checks)
    run_config = run_config or {}
    result = job.with_logger_defs({"console": warnings_console}).execute_in_process(
        run_config={
            **run_config,
            "loggers": {"console": {}},  # a logger named in the run's config, or Dagster's default
            "resources": {**run_config.get("resources", {}), **IN_PROCESS_SPARK},
        },
        instance=instance,
        tags=tags,
        raise_on_error=False,
    )
    release_run_lock(result.run_id)
    return result


def raise_if_storage_refused(result: dg.ExecuteInProcessResult, label: str) -> None:
    """StorageRefusedError when a file system refused the failed run's writes: every other run would
    fail alike, so running on until idle would only repeat the error."""
    for _, error in op_errors(result.all_events):
        if error.cls_name == StorageFullError.__name__:
            raise StorageRefusedError(first_line(error))
        full = storage_failure(error.to_string(), label, LakehousePaths.from_env().written_directories())
        if full is not None:
            raise full


def dagster_instance(paths: LakehousePaths) -> dg.DagsterInstance:
    """The Dagster instance at ``$DAGSTER_HOME``, by default ``$LAKEHOUSE_HOME/dagster``, with the
    project's instance settings (``ensure_instance_settings``), so ``dagster dev`` on the same home
    sees the same settings and runs."""
    note = ensure_instance_settings(dagster_home(paths))
    if note:
        print(note, file=sys.stderr)
    return dg.DagsterInstance.get()


def run_pipeline_until_idle(instance: dg.DagsterInstance, log: Callable[[str], None] = print) -> IdleRunReport:
    """``run_until_idle`` over definitions rebuilt from the configuration until routing finds no
    new table: a table a router found for the first time gets its own stream, sensors and checks."""
    report = IdleRunReport()
    loaded: list[str] = []
    while True:
        config = load_config()
        streams = [stream.name for stream in config.streams]
        if streams == loaded:
            return report
        if loaded:
            log(f"routing found new tables; reloading definitions with streams {sorted(set(streams) - set(loaded))}")
        loaded = streams
        rounds = run_until_idle(build_definitions(config), instance, log)
        report.succeeded.extend(rounds.succeeded)
        report.failed.extend(rounds.failed)


def run_until_idle(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    log: Callable[[str], None] = print,
    max_rounds: int = 1000,
) -> IdleRunReport:
    """Tick every sensor and run what it requests until a whole round requests nothing new."""
    fail_runs_of_dead_processes(instance, log)
    repository = defs.get_repository_def()
    resources = {"lakehouse": LakehouseResource(until_idle=True)}
    cursors: dict[str, str | None] = {}
    report = IdleRunReport()
    # A sensor whose run failed is not ticked again: its next request would fail the same way.
    stalled: set[str] = set()
    for _ in range(max_rounds):
        progressed = False
        for sensor in repository.sensor_defs:
            if sensor.name in stalled:
                continue
            context = dg.build_sensor_context(
                instance=instance, cursor=cursors.get(sensor.name), definitions=defs, resources=resources
            )
            tick = sensor.evaluate_tick(context)
            cursors[sensor.name] = tick.cursor
            for request in tick.run_requests or []:
                if request.run_key and _already_done(instance, sensor.name, request.run_key):
                    continue
                if sensor.job_name is None:
                    raise RuntimeError(f"sensor {sensor.name} requested a run of no job")
                job = repository.get_job(sensor.job_name)
                tags = {**request.tags, SENSOR_NAME_TAG: sensor.name}
                if request.run_key:
                    tags[RUN_KEY_TAG] = request.run_key
                run_config = {**request.run_config, "resources": UNTIL_IDLE_RESOURCES}
                selection = (request.asset_selection, request.asset_check_keys)
                result = run_job(job, instance, run_config, tags, *selection)
                label = f"{job.name} ({request.run_key or 'no run key'}) run {result.run_id}"
                (report.succeeded if result.success else report.failed).append(label)
                if not result.success:
                    raise_if_storage_refused(result, label)
                log(("ok     " if result.success else "FAILED ") + label)
                if not result.success:
                    reason = failure_line(result.all_events)
                    log(f"       {reason or 'see the run in `dagster dev`'}")
                    stalled.add(sensor.name)
                    for check in result.get_asset_check_evaluations():
                        if not check.passed and check.severity == dg.AssetCheckSeverity.ERROR:
                            found = check.metadata.get("found")
                            log(f"       check {check.check_name} failed: {found.value if found else ''}")
                progressed = True
        if not progressed:
            return report
    raise RuntimeError(f"still requesting runs after {max_rounds} rounds")
