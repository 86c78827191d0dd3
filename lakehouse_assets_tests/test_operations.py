"""Operations: backpressure, the freshness check, and the figures and file bounds of a commit."""

import os
import time

import dagster as dg
import pytest

from lakehouse_assets.batches.landing import land_events, landing_dir, list_landing_files
from lakehouse_assets.batches.ledger import CommittedBatch, StreamLedger
from lakehouse_assets.cli.status import lakehouse_status
from lakehouse_assets.config.loader import load_config
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.ingest.micro_batching import mint_next_batch
from lakehouse_assets.ingest.pending_landing import pending_files
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.runner import run_job, run_until_idle
from lakehouse_assets_tests.conftest import ORDERS_STREAM, order_event, write_config
from lakehouse_assets_tests.test_sensors import _tick


@pytest.fixture
def operated(lakehouse_home, tmp_path, monkeypatch):
    stream = {**ORDERS_STREAM, "flush": {"max_bytes": 1, "max_age": "60s"}, "max_lag": "5m"}
    write_config(tmp_path, {"streams": [{**stream, "max_uncommitted_bytes": 1500}]}, monkeypatch)
    return load_config()


def test_backpressure_stops_minting_keeps_landing_and_resumes_after_commits(operated, paths, instance):
    lake = Lakehouse(operated, paths)
    stream = operated.stream("orders")
    for batch in range(4):
        land_events(paths, stream, [order_event(batch * 10 + i) for i in range(10)])  # ~800 bytes per file
    ledger = StreamLedger(paths.staging("orders"))

    minted = [mint_next_batch(lake, stream)[0] for _ in range(2)]
    held, reason = mint_next_batch(lake, stream)

    assert [batch.sequence for batch in minted] == [1, 2] and held is None
    assert reason.startswith("backpressure: ") and "max_uncommitted_bytes 1500" in reason
    tick = _tick(operated, instance, names.landing_sensor_name("orders"))
    assert [request.run_key for request in tick.run_requests] == ["orders:1", "orders:2"]
    assert len(pending_files(paths, stream, ledger, lake.table("sales.orders"))) == 2
    land_events(paths, stream, [order_event(99)])
    assert len(list_landing_files(landing_dir(paths, stream))) == 5

    for batch in minted:
        ledger.record_committed(batch.sequence, CommittedBatch(0, batch.sequence, time.time()))
    assert mint_next_batch(lake, stream)[0].sequence == 3


def test_freshness_check_fails_when_the_oldest_pending_event_is_older_than_max_lag(operated, paths, instance):
    job = build_definitions(operated).get_repository_def().get_job(names.freshness_job_name("sales.orders"))
    key = dg.AssetCheckKey(names.table_key("sales.orders"), names.FRESHNESS_CHECK)
    assert run_job(job, instance).success
    assert instance.get_latest_asset_check_evaluation_record(key).status.value == "SUCCEEDED"

    [landed] = land_events(paths, operated.stream("orders"), [order_event(1)])
    an_hour_ago = time.time() - 3600
    os.utime(landed, (an_hour_ago, an_hour_ago))
    assert run_job(job, instance).success

    record = instance.get_latest_asset_check_evaluation_record(key)
    assert record.status.value == "FAILED"
    evaluation = record.event.dagster_event.event_specific_data
    assert "stream orders: oldest uncommitted event waited 36" in evaluation.description
    assert evaluation.metadata["lag_seconds.orders"].value >= 3600


@pytest.mark.spark
def test_a_commit_reports_its_figures_and_writes_at_most_one_file_per_partition_and_task(lake, instance):
    days = 7
    events = [order_event(i, ts=f"2026-11-{1 + i % days:02d}T08:00:00Z") for i in range(700)]
    land_events(lake.paths, lake.stream("orders"), events)

    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []

    metadata = instance.get_latest_materialization_event(names.table_key("sales.orders")).asset_materialization.metadata
    figures = {key: entry.value for key, entry in metadata.items()}
    tasks = int(load_config().spark.get("spark.sql.shuffle.partitions", "4"))
    assert 0 < figures["data_files_added"] <= days * tasks
    assert figures["table_data_files"] == figures["data_files_added"]
    assert figures["rows_per_second"] > 0 and figures["table_rows"] == 700
    assert figures["lag_seconds.orders"] == 0
    # The writer's staged snapshot (on no branch) and the commit that published its files.
    assert figures["table_snapshots"] == 2 and figures["table_metadata_bytes"] > 0
    [entry] = lakehouse_status(lake, instance)
    assert entry["table_data_files"] == figures["table_data_files"]
    assert entry["streams"][0]["lag_seconds"] == 0 and entry["streams"][0]["held_back"] is None
    assert entry["last_checks"][names.FRESHNESS_CHECK] == "SUCCEEDED"
