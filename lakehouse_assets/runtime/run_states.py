"""The Dagster run states the package reads, named once for the sensors, the runner and the
benchmarks."""

from __future__ import annotations

import dagster as dg

FAILED = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
"""A writer run that ended so, its batch not staged, is run again (a run cancelled or timed out too)."""
LAUNCHED = (
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
)
"""Runs handed to a run worker and not ended: each holds (or is about to take) its liveness lock."""
UNFINISHED = (dg.DagsterRunStatus.QUEUED, *LAUNCHED)
"""Runs not ended: queued for the run coordinator, or launched."""
