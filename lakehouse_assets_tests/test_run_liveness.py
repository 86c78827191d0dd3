"""A run's liveness lock tells whether its process is alive, and the run launcher answers Dagster's
run monitoring from it: a run whose process was killed is reported failed, a live one running."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.runtime import run_launcher
from lakehouse_assets.runtime.run_launcher import LivenessCheckingRunLauncher
from lakehouse_assets.runtime.run_liveness import (
    LIVENESS_TAG,
    RUN_KIND_TAG,
    RunProcess,
    hold_run_lock,
    liveness_label,
    release_run_lock,
    run_process,
)

HOLDER = """
import sys, time
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.runtime.run_liveness import hold_run_lock
print(hold_run_lock(LakehousePaths.from_env(), sys.argv[1]), flush=True)
time.sleep(600)
"""


@pytest.fixture
def run_holder(lakehouse_home):
    """A real process holding the liveness lock of run ``run-1``, as a run worker does; killed after."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, "run-1"], stdout=subprocess.PIPE, text=True)
    lock_file = Path(process.stdout.readline().strip())
    yield process, liveness_label(lock_file)
    process.kill()
    process.wait()


def _run(tags: dict[str, str]) -> dg.DagsterRun:
    return dg.DagsterRun(job_name="orders_stage_job", run_id="run-1", tags=tags)


def test_a_killed_run_process_is_told_by_its_free_lock(run_holder):
    process, label = run_holder
    assert run_process(label) is RunProcess.ALIVE

    process.send_signal(signal.SIGKILL)
    process.wait()

    assert run_process(label) is RunProcess.GONE


def test_a_run_without_a_lock_or_on_another_host_is_not_judged(lakehouse_home):
    assert run_process(None) is RunProcess.UNKNOWN
    assert run_process("another-host:/tmp/run-1.lock") is RunProcess.UNKNOWN


def test_a_lock_released_by_a_process_that_runs_many_runs_is_free(lakehouse_home):
    lock_file = hold_run_lock(LakehousePaths.from_env(), "run-2")
    assert run_process(liveness_label(lock_file)) is RunProcess.ALIVE, "a probe from this process sees it held"
    release_run_lock("run-2")
    assert run_process(liveness_label(lock_file)) is RunProcess.GONE


def test_the_run_launcher_reports_a_run_whose_process_died_as_failed(run_holder):
    process, label = run_holder
    launcher = LivenessCheckingRunLauncher()
    run = _run({RUN_KIND_TAG: "writer", LIVENESS_TAG: label})
    assert launcher.supports_check_run_worker_health
    assert launcher.check_run_worker_health(run).status.value == "RUNNING"

    os.kill(process.pid, signal.SIGKILL)
    process.wait()

    health = launcher.check_run_worker_health(run)
    assert health.status.value == "FAILED" and "process is gone" in health.msg


def test_the_run_launcher_fails_a_pipeline_run_that_never_took_its_lock_only_after_the_grace(instance, monkeypatch):
    launcher = LivenessCheckingRunLauncher()
    launcher.register_instance(instance)
    pipeline_run = _started_run(instance, {RUN_KIND_TAG: "writer"})
    user_run = _started_run(instance, {})

    assert launcher.check_run_worker_health(pipeline_run).status.value == "RUNNING", "within the grace"
    monkeypatch.setattr(run_launcher, "LOCK_GRACE_SECONDS", 0.0)
    time.sleep(0.01)
    health = launcher.check_run_worker_health(pipeline_run)
    assert health.status.value == "FAILED" and "never took its liveness lock" in health.msg
    assert launcher.check_run_worker_health(user_run).status.value == "RUNNING", "not a pipeline run: not judged"


def _started_run(instance: dg.DagsterInstance, tags: dict[str, str]) -> dg.DagsterRun:
    """A run recorded as STARTED whose process never set anything up."""
    run = instance.create_run_for_job(dg.GraphDefinition("noop").to_job(), tags=tags)
    instance.report_dagster_event(
        dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_START.value, job_name=run.job_name), run.run_id
    )
    started = instance.get_run_by_id(run.run_id)
    assert started.status == dg.DagsterRunStatus.STARTED
    return started
