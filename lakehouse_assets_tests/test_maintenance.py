"""Maintenance through its Dagster job: fewer files, same rows, orphans gone, landing files kept
until no rollback could need them."""

import os
import time
from pathlib import Path

import dagster as dg
import pytest

from lakehouse_assets.batches.landing import land_events, landing_dir, list_landing_files
from lakehouse_assets.batches.ledger import StreamLedger
from lakehouse_assets.config.loader import load_config
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.ingest.landing_retention import remove_committed_landing_files
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.quality.table_stats import table_stats
from lakehouse_assets.runner import run_job, run_until_idle
from lakehouse_assets_tests.conftest import ORDERS_STREAM, order_event, write_config

pytestmark = pytest.mark.spark

MAINTAINED_ORDERS = {
    **ORDERS_STREAM,
    "maintenance": {
        "compaction": {"min_input_files": 2},
        "expire_snapshots": {"older_than": "0s", "retain_last": 1},
        "remove_orphan_files": {"older_than": "10m"},
        "landing_retention": "0s",
    },
}


@pytest.fixture
def maintained(lakehouse_home, tmp_path, monkeypatch):
    write_config(tmp_path, {"streams": [MAINTAINED_ORDERS]}, monkeypatch)
    return load_config()


def _rows(lake):
    table = lake.table("sales.orders")
    return sorted(table.scan(selected_fields=("order_id", "amount")).to_arrow().to_pylist(), key=str)


def test_maintenance_compacts_expires_and_cleans_without_changing_rows(maintained, paths, instance):
    lake = Lakehouse(maintained, paths)
    stream = lake.stream("orders")
    defs = build_definitions(lake.config)
    for batch in range(3):
        land_events(paths, stream, [order_event(batch * 100 + i) for i in range(100)])
        assert run_until_idle(defs, instance, log=lambda _: None).failed == []
    table = lake.table("sales.orders")
    before, rows = table_stats(table), _rows(lake)
    # No checkpoint yet: the table could still be rolled back to before any batch.
    assert remove_committed_landing_files(paths, stream, table, time.time())["landing_files_removed"] == 0
    data_dir = paths.warehouse / "sales" / "orders" / "data"
    aborted = data_dir / "00000-0-aborted-write.parquet"
    aborted.write_bytes(b"PAR1 left by a writer that died")
    an_hour_ago = time.time() - 3600
    os.utime(aborted, (an_hour_ago, an_hour_ago))
    recent = data_dir / "00000-0-write-in-flight.parquet"
    recent.write_bytes(b"PAR1 still being written")

    job = defs.get_repository_def().get_job(names.maintenance_job_name("sales.orders"))
    result = run_job(job, instance)

    assert result.success
    [observation] = result.asset_observations_for_node(names.maintenance_op_name("sales.orders"))
    figures = {key: entry.value for key, entry in observation.metadata.items()}
    assert figures["compaction.rewritten_data_files_count"] >= before["table_data_files"]
    assert figures["table_data_files"] < before["table_data_files"]
    assert figures["table_snapshots"] == 1
    assert figures["expire_snapshots.snapshots_expired"] > before["table_snapshots"]
    assert figures["remove_orphan_files.orphan_files_removed"] == 1
    assert not aborted.exists() and recent.exists()
    # Expiry deleted the files only the expired snapshots referenced (the compacted ones, younger
    # than the orphan grace): what is left on disk is what the table references.
    referenced = {Path(task.file.file_path).name for task in lake.table("sales.orders").scan().plan_files()}
    assert {path.name for path in data_dir.rglob("*.parquet")} - {recent.name} == referenced
    assert _rows(lake) == rows
    assert list_landing_files(landing_dir(paths, stream)) == []
    assert StreamLedger(paths.staging("orders")).batches() == []

    # Events landed after maintenance flow as before, on top of the checkpoint.
    land_events(paths, stream, [order_event(1000)])
    assert run_until_idle(defs, instance, log=lambda _: None).failed == []
    assert len(_rows(lake)) == len(rows) + 1
    key = names.table_key("sales.orders")
    for check_name in names.CHECK_NAMES:
        record = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(key, check_name))
        assert record.status.value == "SUCCEEDED", check_name
