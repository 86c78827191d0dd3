"""Exactly-once under failure: real pipeline processes killed, failed, paused and raced, then
restarted, with the invariant checker reading the result against an oracle of the landing files."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from lakehouse_assets import faults
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.runner import IN_PROCESS_SPARK
from lakehouse_assets_tests.fault_injection.invariants import each_batch_committed_once, invariant_violations
from lakehouse_assets_tests.fault_injection.pipeline import (
    kill_at_then_restart,
    land_round,
    remove_staged_parquet,
    run_pipeline,
    run_two_pipelines_at_once,
    worker_gateway_env,
)

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("point", faults.CRASH_POINTS)
def test_a_pipeline_killed_at_each_point_recovers_exactly_once(point, lake):
    land_round(lake, 1)

    # At the first point the killed process is cold (a JVM of its own, which dies with it); at the
    # others a real process is killed on this worker's JVM. Each restarts in this process.
    kill_at_then_restart(point, cold=point == faults.CRASH_POINTS[0])

    assert invariant_violations(lake) == []


def test_a_crash_then_wiped_local_state_loses_and_duplicates_nothing(lake, lakehouse_home):
    land_round(lake, 1)
    crashed = run_pipeline({faults.CRASH_ENV: faults.COMMITTER_AFTER_COMMIT})
    assert crashed.returncode == -signal.SIGKILL

    # Locks, sensor cursors and the whole Dagster run history are gone.
    shutil.rmtree(lakehouse_home / "state")
    dagster_home = Path(os.environ["DAGSTER_HOME"])
    shutil.rmtree(dagster_home)
    dagster_home.mkdir()
    land_round(lake, 2)
    restarted = run_pipeline()

    assert restarted.returncode == 0, restarted.stdout[-3000:] + restarted.stderr[-3000:]
    assert invariant_violations(lake) == []


@pytest.mark.parametrize("point", [faults.COMMITTER_AFTER_WRITE, faults.DEAD_LETTERS_AFTER_WRITE])
def test_an_error_after_a_commit_landed_is_decided_by_the_ancestry(point, lake):
    land_round(lake, 1)

    # Every write of the table (or of its dead letters) "fails" after its commit landed: the
    # committer must see the commit in the ancestry and go on, never commit the batch again.
    completed = run_pipeline({faults.FAIL_ENV: point})

    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert invariant_violations(lake) == []
    assert each_batch_committed_once(lake, "crm.customers")


def test_a_failed_commit_keeps_staged_data_for_the_next_run(lake):
    land_round(lake, 1)

    failed = run_pipeline({faults.FAIL_ENV: faults.COMMITTER_BEFORE_COMMIT})
    assert failed.returncode == 1
    staged = [r.sequence for r in lake.ledger("orders").batches() if r.status == "staged"]
    assert staged, "the failed commit must leave its batches staged"
    assert run_pipeline().returncode == 0

    assert invariant_violations(lake) == []


def test_two_pipelines_at_once_commit_each_batch_once(lake, tmp_path):
    for round_number in (1, 2):
        land_round(lake, round_number)

    run_two_pipelines_at_once(tmp_path)

    assert invariant_violations(lake) == []
    assert each_batch_committed_once(lake, "sales.orders")
    assert each_batch_committed_once(lake, "crm.customers")


STALE_COMMITTER = """
from lakehouse_assets_tests.fault_injection.attached_cli import attach_to_running_jvm
attach_to_running_jvm()
from lakehouse_assets.ingest.table_commits import commit_table
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.engine.spark import lakehouse_session
lake = Lakehouse.from_env()
outcome = commit_table(lakehouse_session(lake), lake, "sales.orders", "stale-committer")
print("FENCED:", outcome.fenced)
print("COMMITS:", len(outcome.results))
"""


def _stage_in_process(config, instance, stream):
    """Run the stream's landing sensor and the staging step of the writer runs it requests, without committing."""
    defs = build_definitions(config)
    repository = defs.get_repository_def()
    sensor = repository.get_sensor_def(names.landing_sensor_name(stream))
    context = dg.build_sensor_context(
        instance=instance, definitions=defs, resources={"lakehouse": LakehouseResource(until_idle=True)}
    )
    for request in sensor.evaluate_tick(context).run_requests:
        repository.get_job(names.stage_job_name(stream)).execute_in_process(
            run_config={**request.run_config, "resources": IN_PROCESS_SPARK},
            instance=instance,
            asset_selection=[names.staged_batches_key(stream)],
        )


def test_a_stale_committer_is_fenced_and_commits_nothing(lake, instance, tmp_path):
    land_round(lake, 1)
    _stage_in_process(lake.config, instance, "orders")
    pause_dir = tmp_path / "pauses"
    pause_dir.mkdir()

    # A committer outside Dagster's pool (another deployment, a script) plans, then stalls.
    stale = subprocess.Popen(
        [sys.executable, "-c", STALE_COMMITTER],
        env=os.environ
        | worker_gateway_env()
        | {faults.PAUSE_ENV: faults.COMMITTER_BEFORE_LOCK, faults.PAUSE_DIR_ENV: str(pause_dir)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not (pause_dir / f"{faults.COMMITTER_BEFORE_LOCK}.paused").exists():
        assert time.monotonic() < deadline and stale.poll() is None, stale.stdout.read()[-3000:]
        time.sleep(0.2)
    # Meanwhile the pipeline commits the same batches.
    assert run_pipeline().returncode == 0
    (pause_dir / f"{faults.COMMITTER_BEFORE_LOCK}.release").touch()
    output, _ = stale.communicate(timeout=600)

    assert stale.returncode == 0, output[-3000:]
    assert "stopping without committing" in output and "COMMITS: 0" in output
    assert invariant_violations(lake) == []
    assert each_batch_committed_once(lake, "sales.orders")


def test_a_rolled_back_table_gets_its_batches_again(lake):
    kept = lake.table("sales.orders").current_snapshot().snapshot_id
    land_round(lake, 1)
    assert run_pipeline().returncode == 0
    remove_staged_parquet(lake)  # as the next committer pass would

    lakehouse_session(lake).sql(f"CALL lake.system.rollback_to_snapshot('sales.orders', {kept})")
    assert invariant_violations(lake) != []
    assert run_pipeline().returncode == 0

    assert invariant_violations(lake) == []


def test_a_storage_error_while_writing_metadata_loses_nothing(lake):
    land_round(lake, 1)
    current = lake.metadata_location("sales.orders")
    version = int(current.rsplit("/v", 1)[1].split(".")[0])
    # The next metadata file's name is taken: the catalog cannot write the new table version.
    obstacles = [current.replace(f"/v{version}.", f"/v{version + n}.") for n in (1, 2)]
    for obstacle in obstacles:
        os.makedirs(obstacle)

    failed = run_pipeline()
    assert failed.returncode == 1
    for obstacle in obstacles:
        shutil.rmtree(obstacle)
    assert run_pipeline().returncode == 0

    assert invariant_violations(lake) == []


def test_a_missing_batch_blocks_later_batches_loudly(lake, instance):
    for round_number in (1, 2):
        land_round(lake, round_number)
        _stage_in_process(lake.config, instance, "customers")
    repository = build_definitions(lake.config).get_repository_def()
    ledger = lake.ledger("customers")
    committed = [r.sequence for r in ledger.batches() if r.committed]
    missing = max(committed) + 1
    shutil.rmtree(ledger.batch(missing).directory)

    result = repository.get_job(names.commit_job_name("crm.customers")).execute_in_process(
        run_config={"resources": IN_PROCESS_SPARK}, instance=instance, raise_on_error=False
    )

    assert not result.success
    key = dg.AssetCheckKey(names.table_key("crm.customers"), names.SEQUENCE_CHECK)
    record = instance.get_latest_asset_check_evaluation_record(key)
    assert record.status.value == "FAILED"
    found = record.event.dagster_event.event_specific_data.metadata["found"].value
    assert f"batch {missing} is missing from the staging ledger" in found
    summary = lake.table("crm.customers").current_snapshot().summary
    assert int(summary.additional_properties[summary_keys.COMMIT_SEQUENCE]) < missing
