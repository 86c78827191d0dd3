"""Change batches committed as row deltas through the key index: what readers see, the index
wiped, damaged or stale, and a real process killed at each of the path's own fault points.

``crm.customers`` of the fault pipeline is a format-2, merge-on-read change table, so each of its
batches after the first (which the ``lake`` fixture commits) updates and deletes rows.
"""

import json
import shutil

import pytest

from lakehouse_assets import faults
from lakehouse_assets.commit.key_index import MANIFEST
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.quality.duck import iceberg_connection, manifest_entries, scan, single_count
from lakehouse_assets_tests.fault_injection.invariants import each_batch_committed_once, invariant_violations
from lakehouse_assets_tests.fault_injection.pipeline import land_round, run_lakehouse, run_pipeline

pytestmark = pytest.mark.spark

CUSTOMERS = "crm.customers"


def _run(lake: Lakehouse, round_number: int) -> None:
    land_round(lake, round_number)
    completed = run_pipeline()
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]


def _index_manifest(lake: Lakehouse) -> dict:
    return json.loads((lake.paths.key_index(CUSTOMERS) / MANIFEST).read_text())


@pytest.mark.second_round  # round 1, a row delta already, committed in the template (``conftest.py``)
def test_change_batches_commit_as_row_deltas_that_readers_see_as_position_deletes(lake):
    _run(lake, 2)

    assert invariant_violations(lake) == []
    assert each_batch_committed_once(lake, CUSTOMERS)
    table = lake.require_table(CUSTOMERS)
    snapshot = table.current_snapshot()
    summary = snapshot.summary.additional_properties
    assert int(summary["added-position-deletes"]) > 0
    assert summary.get("total-equality-deletes", "0") == "0"
    connection = iceberg_connection()
    entries = manifest_entries(table.metadata_location, snapshot.snapshot_id)
    kinds = {str(kind).upper() for (kind,) in connection.sql(f"SELECT DISTINCT content FROM {entries}").fetchall()}
    assert any("POSITION" in kind for kind in kinds), kinds
    assert not any("EQUALITY" in kind for kind in kinds), kinds
    # The index describes exactly the table's live rows at its head.
    manifest = _index_manifest(lake)
    assert manifest["snapshot_id"] == snapshot.snapshot_id
    live = sum(s["rows"] for s in manifest["entries"]) - sum(s["rows"] for s in manifest["removed"])
    rows = scan(table.metadata_location, snapshot.snapshot_id)
    assert live == single_count(connection, f"SELECT count(*) FROM {rows}")

    # Compaction renumbers the rows: maintenance rebuilds the index for the new head.
    maintained = run_lakehouse(["maintain", "--table", CUSTOMERS])
    assert maintained.returncode == 0, maintained.stdout[-3000:] + maintained.stderr[-3000:]
    compacted = lake.require_table(CUSTOMERS).current_snapshot()
    assert compacted.snapshot_id != snapshot.snapshot_id
    assert _index_manifest(lake)["snapshot_id"] == compacted.snapshot_id
    _run(lake, 3)
    assert invariant_violations(lake) == []


def test_a_wiped_damaged_or_stale_key_index_is_rebuilt_from_the_table(lake):
    index = lake.paths.key_index(CUSTOMERS)
    stale = index.with_name("stale-copy")
    shutil.copytree(index, stale)  # describes the first round's snapshot
    shutil.rmtree(index)  # wiped
    _run(lake, 1)
    assert invariant_violations(lake) == []

    shutil.rmtree(index)
    stale.rename(index)
    _run(lake, 2)
    assert invariant_violations(lake) == []

    segment = index / _index_manifest(lake)["entries"][0]["file"]
    segment.write_bytes(b"\0" * segment.stat().st_size)  # same size, not Parquet
    _run(lake, 3)
    assert invariant_violations(lake) == []

    (index / MANIFEST).write_text("{not json")
    _run(lake, 4)
    assert invariant_violations(lake) == []
    assert each_batch_committed_once(lake, CUSTOMERS)
    assert _index_manifest(lake)["snapshot_id"] == lake.require_table(CUSTOMERS).current_snapshot().snapshot_id


def test_a_row_delta_killed_at_each_of_its_points_recovers_exactly_once(lake):
    """Four real processes killed, each followed by a restart on this worker's warm JVM; the
    first point's process is cold (a JVM of its own, which dies with it). The rebuild's point is
    reached by wiping the index first."""
    for round_number, point in enumerate(faults.ROW_DELTA_CRASH_POINTS, start=1):
        if point == faults.KEY_INDEX_DURING_REBUILD:
            shutil.rmtree(lake.paths.key_index(CUSTOMERS))
        land_round(lake, round_number)
        crashed = run_pipeline({faults.CRASH_ENV: point}, cold=round_number == 1)
        assert crashed.returncode == -9, f"never reached {point}:\n{crashed.stdout[-3000:]}{crashed.stderr[-3000:]}"
        restarted = run_pipeline()
        assert restarted.returncode == 0, restarted.stdout[-3000:] + restarted.stderr[-3000:]
        assert invariant_violations(lake) == [], point

    assert each_batch_committed_once(lake, CUSTOMERS)
