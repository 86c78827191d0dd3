"""Recovery survives table maintenance: expiry cuts the ancestry only behind a checkpoint, a crash
between the two is harmless, and an expiry that skipped the checkpoint is refused loudly."""

import os
import shutil
import signal
from pathlib import Path

import pytest

from lakehouse_assets import faults
from lakehouse_assets.commit.recovery import CHECKPOINT_PROPERTY, committed_state
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets_tests.fault_injection.invariants import invariant_violations
from lakehouse_assets_tests.fault_injection.pipeline import (
    land_round,
    remove_staged_parquet,
    run_lakehouse,
    run_pipeline,
)

# Every test here starts from the first two rounds committed (``conftest.py``): maintenance has
# history to compact and expire before the fault.
pytestmark = [pytest.mark.spark, pytest.mark.second_round]

TABLES = ("sales.orders", "crm.customers")


def _ancestry_is_cut(lake, identifier):
    table = lake.table(identifier)
    snapshots = {snapshot.snapshot_id: snapshot for snapshot in table.metadata.snapshots}
    oldest = min(snapshots.values(), key=lambda snapshot: snapshot.sequence_number)
    return oldest.parent_snapshot_id is not None and CHECKPOINT_PROPERTY in table.metadata.properties


def _maintain():
    completed = run_lakehouse(["maintain"])
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed.stdout


def test_expiry_and_compaction_keep_recovery_exactly_once(lake, lakehouse_home):
    before = {
        stream.name: committed_state(lake.table(stream.table_identifier), stream.name) for stream in lake.config.streams
    }

    output = _maintain()

    assert "compaction.rewritten_data_files_count" in output
    for identifier in TABLES:
        assert _ancestry_is_cut(lake, identifier), identifier
    for stream in lake.config.streams:
        after = committed_state(lake.table(stream.table_identifier), stream.name)
        assert after.sequence == before[stream.name].sequence
        assert after.epoch == before[stream.name].epoch
    assert invariant_violations(lake) == []

    # Local state and Dagster's history wiped, new events: nothing is re-committed or lost.
    shutil.rmtree(lakehouse_home / "state")
    shutil.rmtree(Path(os.environ["DAGSTER_HOME"]))
    Path(os.environ["DAGSTER_HOME"]).mkdir()
    kept = {identifier: lake.table(identifier).current_snapshot().snapshot_id for identifier in TABLES}
    land_round(lake, 2)
    assert run_pipeline().returncode == 0
    remove_staged_parquet(lake)  # as the next committer pass would
    assert invariant_violations(lake) == []

    # A rollback to a snapshot maintenance kept re-commits round 2, staged again from landing files.
    session = lakehouse_session(lake)
    for identifier, snapshot_id in kept.items():
        session.sql(f"CALL lake.system.rollback_to_snapshot('{identifier}', {snapshot_id})")
    assert invariant_violations(lake) != []
    assert run_pipeline().returncode == 0
    assert invariant_violations(lake) == []


def test_maintenance_killed_between_checkpoint_and_expiry(lake):
    # The family's cold kill: the process starts a JVM of its own, which dies with it.
    crashed = run_lakehouse(["maintain"], {faults.CRASH_ENV: faults.MAINTENANCE_AFTER_CHECKPOINT}, cold=True)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-3000:] + crashed.stderr[-3000:]
    land_round(lake, 2)
    assert run_pipeline().returncode == 0
    assert invariant_violations(lake) == []

    _maintain()
    land_round(lake, 3)
    assert run_pipeline().returncode == 0
    assert invariant_violations(lake) == []


def test_an_expiry_without_checkpoint_stops_the_committer_loudly(lake):
    # Someone expires snapshots with Iceberg's procedure directly: the stream's commits are gone.
    lakehouse_session(lake).sql(
        "CALL lake.system.expire_snapshots(table => 'sales.orders', older_than => TIMESTAMP '2100-01-01', "
        "retain_last => 1)"
    )
    rows_before = lake.table("sales.orders").scan().to_arrow().num_rows
    land_round(lake, 2)

    failed = run_pipeline()

    # The micro-batch sensor is the first to read the ancestry: it refuses to number new batches.
    assert failed.returncode == 2
    assert "no lakehouse checkpoint covers it" in failed.stderr
    assert lake.table("sales.orders").scan().to_arrow().num_rows == rows_before
