"""``lakehouse run --until-idle``: evaluate the sensors and execute the runs they request, in-process.

Runs go through the same Dagster definitions and are recorded in the Dagster instance, so
``dagster dev`` on the same ``DAGSTER_HOME`` shows their materializations and check results. The
landing sensors run in drain mode: every pending event is cut into batches, whatever the flush
triggers say, so "idle" means nothing is pending.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import dagster as dg

from lakehouse_assets.defs.resources import LakehouseResource

RUN_KEY_TAG = "dagster/run_key"
SENSOR_NAME_TAG = "dagster/sensor_name"
# Step-by-step events still go to the instance (and the UI); the console shows warnings and errors.
QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


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


def run_until_idle(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    log: Callable[[str], None] = print,
    max_rounds: int = 1000,
) -> IdleRunReport:
    """Tick every sensor and run what it requests until a whole round requests nothing new."""
    repository = defs.get_repository_def()
    drain = {"lakehouse": LakehouseResource(drain=True)}
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
                instance=instance, cursor=cursors.get(sensor.name), definitions=defs, resources=drain
            )
            tick = sensor.evaluate_tick(context)
            cursors[sensor.name] = tick.cursor
            for request in tick.run_requests or []:
                if request.run_key and _already_done(instance, sensor.name, request.run_key):
                    continue
                job = repository.get_job(sensor.job_name)
                tags = {**request.tags, SENSOR_NAME_TAG: sensor.name}
                if request.run_key:
                    tags[RUN_KEY_TAG] = request.run_key
                result = job.execute_in_process(
                    run_config={**request.run_config, **QUIET_CONSOLE},
                    instance=instance,
                    tags=tags,
                    raise_on_error=False,
                )
                label = f"{job.name} ({request.run_key or 'no run key'}) run {result.run_id}"
                (report.succeeded if result.success else report.failed).append(label)
                log(("ok     " if result.success else "FAILED ") + label)
                if not result.success:
                    stalled.add(sensor.name)
                progressed = True
        if not progressed:
            return report
    raise RuntimeError(f"still requesting runs after {max_rounds} rounds")
