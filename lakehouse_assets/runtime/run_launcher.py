"""The run launcher of ``dagster.yaml``: Dagster's default launcher, plus a run-worker health check.

Dagster's run monitoring fails a run whose worker died, but only when the launcher can tell (the
Kubernetes, ECS and Docker launchers ask their platform); the default launcher, which ``dagster
dev`` and a single-server daemon use, cannot, so a run whose process was killed (an OOM kill, a
crash, the whole ``dagster dev`` killed) stayed STARTED for ever and held its batch and its
table's commit slot. This launcher launches exactly as the default one and answers the health
check from the run's liveness lock (``lakehouse_assets.runtime.run_liveness``): the daemon then marks the
run failed, frees its pool slots, and Dagster's run retries or the landing sensor run the batch
again.

Configured in ``dagster.yaml`` (``run_launcher``); the daemon imports this module, which imports
neither Spark nor the pipeline's definitions.
"""

from __future__ import annotations

import time

import dagster as dg

# Dagster exports the launcher but not its health-check types: a subclass has to name them.
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus

from lakehouse_assets.runtime.run_liveness import LIVENESS_TAG, RUN_KIND_TAG, RunProcess, run_process

LOCK_GRACE_SECONDS = 60.0
"""How long a started run of the pipeline may go without taking its liveness lock (its process
loads the code location and sets up resources first; a few seconds on a busy laptop)."""


class LivenessCheckingRunLauncher(dg.DefaultRunLauncher):
    """``DefaultRunLauncher`` whose run-worker health check reads the run's liveness lock."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        """RUNNING while the run's process holds its lock; FAILED once the lock is free, or when a
        pipeline run (tagged ``RUN_KIND_TAG``) took none within ``LOCK_GRACE_SECONDS`` of starting.
        Runs of other jobs, which take no lock, are left to their own devices."""
        state = run_process(run.tags.get(LIVENESS_TAG))
        if state is RunProcess.GONE:
            return CheckRunHealthResult(WorkerStatus.FAILED, "the run's process is gone (its liveness lock is free)")
        if state is RunProcess.UNKNOWN and RUN_KIND_TAG in run.tags and LIVENESS_TAG not in run.tags:
            record = self._instance.get_run_record_by_id(run.run_id)
            started = record.start_time if record else None
            if started is not None and time.time() - started > LOCK_GRACE_SECONDS:
                return CheckRunHealthResult(
                    WorkerStatus.FAILED,
                    f"the run's process never took its liveness lock within {LOCK_GRACE_SECONDS:.0f}s of starting",
                )
        return CheckRunHealthResult(WorkerStatus.RUNNING)
