"""End to end with real engines: landing -> sensor -> Spark writer -> committer -> DuckDB checks."""

import json
import sys

import dagster as dg
import pytest

from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.commit.recovery import lakehouse_commits
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.engine.spark import SPAWN_DIRECTLY, lakehouse_session
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.ingest.micro_batching import mint_next_batch
from lakehouse_assets.ingest.staging import stage_batch
from lakehouse_assets.ingest.table_commits import commit_table
from lakehouse_assets.quality.duck import iceberg_connection, scan
from lakehouse_assets.runner import run_until_idle
from lakehouse_assets_tests.conftest import order_event

pytestmark = pytest.mark.spark
PROCESS_LAUNCH_PROPERTY = "jdk.lang.Process.launchMechanism"


def _duckdb_rows(lake, identifier, columns="*"):
    table = lake.table(identifier)
    location = lake.metadata_location(identifier)
    query = f"SELECT {columns} FROM {scan(location, table.current_snapshot().snapshot_id)} ORDER BY 1"
    return iceberg_connection().sql(query).fetchall()


def test_events_flow_end_to_end_and_every_event_is_accounted_for(lake, instance):
    stream = lake.stream("orders")
    land_events(lake.paths, stream, [order_event(i) for i in range(1, 301)])
    land_events(lake.paths, stream, [order_event(i) for i in range(301, 401)] + [json.dumps({"customer_id": 5})])
    land_events(lake.paths, stream, [order_event(401, amount="12.5", ts=1764064800000), order_event(402, amount="n/a")])

    report = run_until_idle(build_definitions(lake.config), instance, log=lambda _: None)

    assert report.failed == []
    order_ids = [row[0] for row in _duckdb_rows(lake, "sales.orders", "order_id")]
    assert order_ids == list(range(1, 403))
    coerced = _duckdb_rows(lake, "sales.orders", "order_id, amount, epoch_ms(ts)")
    assert coerced[400] == (401, 12.5, 1764064800000)
    assert coerced[401] == (402, None, coerced[401][2])
    dead = _duckdb_rows(lake, "sales.orders_dead_letters", "event, reason, stream, batch_sequence")
    assert dead == [('{"customer_id": 5}', "missing required field 'order_id'", "orders", 1)]

    [commit] = lakehouse_commits(lake.table("sales.orders"))
    assert (commit.stream, commit.first_sequence, commit.last_sequence, commit.rows) == ("orders", 1, 1, 402)
    table_key = names.table_key("sales.orders")
    materialization = instance.get_latest_materialization_event(table_key).asset_materialization
    assert materialization.metadata["rows"].value == 402
    assert materialization.metadata["dead_letters"].value == 1
    for check_name in names.CHECK_NAMES:
        record = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(table_key, check_name))
        assert record.status.value == "SUCCEEDED", check_name
    warning = instance.get_latest_asset_check_evaluation_record(
        dg.AssetCheckKey(table_key, names.DEAD_LETTERS_CHECK)
    ).event.dagster_event.event_specific_data
    assert (warning.passed, warning.severity) == (False, dg.AssetCheckSeverity.WARN)
    assert warning.metadata["reasons"].value == {"missing required field 'order_id'": 1}


def test_each_commit_carries_the_summary_keys_and_ranges_stay_contiguous(lake, instance):
    stream = lake.stream("orders")
    defs = build_definitions(lake.config)
    for start in (1, 11, 21):
        land_events(lake.paths, stream, [order_event(i) for i in range(start, start + 10)])
        assert run_until_idle(defs, instance, log=lambda _: None).failed == []
    table = lake.table("sales.orders")
    summaries = [c for c in lakehouse_commits(table)]
    assert [(c.first_sequence, c.last_sequence, c.rows) for c in summaries] == [
        (1, 1, 10),
        (2, 2, 10),
        (3, 3, 10),
    ]
    summary = table.current_snapshot().summary.additional_properties
    assert summary[summary_keys.COMMIT_SEQUENCE] == "3"
    assert summary[summary_keys.MAX_EVENT_TIME].startswith("2026-11-")
    assert json.loads(summary[summary_keys.SOURCE_OFFSETS])["files"] == 1
    assert summary[summary_keys.COMMITTER_RUN]
    assert [c.epoch for c in summaries] == [1, 2, 3]


def test_committer_with_nothing_pending_changes_nothing(lake):
    stream = lake.stream("orders")
    spark = lakehouse_session(lake)
    land_events(lake.paths, stream, [order_event(i) for i in range(5)])
    batch, _ = mint_next_batch(lake, stream, drain=True)
    stage_batch(spark, lake, stream, batch.sequence)
    commit_table(spark, lake, "sales.orders", "first")
    before = lake.metadata_location("sales.orders")

    outcome = commit_table(spark, lake, "sales.orders", "second")

    assert outcome.results == [] and outcome.plans[0].ready == [] and outcome.fenced is None
    assert lake.metadata_location("sales.orders") == before


def test_spark_runs_the_local_file_systems_chmod_without_a_spawn_helper(lake):
    """Hadoop's local file system runs ``chmod`` for every file and directory it creates; on Linux
    Spark's JVM executes it directly (``SPAWN_DIRECTLY``), not through Java 17's spawn helper.
    Elsewhere (macOS's Java has no VFORK) the JVM keeps its own way."""
    system = lakehouse_session(lake).sparkContext._jvm.java.lang.System
    expected = SPAWN_DIRECTLY.split("=", 1)[1] if sys.platform.startswith("linux") else None

    assert system.getProperty(PROCESS_LAUNCH_PROPERTY) == expected


def test_repeated_and_concurrent_writer_attempts_leave_one_staged_batch(lake):
    stream = lake.stream("orders")
    spark = lakehouse_session(lake)
    land_events(lake.paths, stream, [order_event(i) for i in range(20)])
    batch, _ = mint_next_batch(lake, stream, drain=True)
    first = stage_batch(spark, lake, stream, batch.sequence)
    second = stage_batch(spark, lake, stream, batch.sequence, expected_files=batch.files)
    assert first.written_now and not second.written_now
    assert second.staged == first.staged
    directory = lake.ledger("orders").batch(1).directory
    attempts = [p.name for p in directory.iterdir() if p.is_dir() and p.name.startswith("attempt-")]
    assert attempts == [f"attempt-{first.staged.attempt}"]


def test_a_commit_whose_bookkeeping_was_lost_is_not_committed_again(lake):
    stream = lake.stream("orders")
    spark = lakehouse_session(lake)
    land_events(lake.paths, stream, [order_event(i) for i in range(1, 8)])
    batch, _ = mint_next_batch(lake, stream, drain=True)
    stage_batch(spark, lake, stream, batch.sequence)
    commit_table(spark, lake, "sales.orders", "crashed-before-bookkeeping")
    ledger = lake.ledger("orders")
    (ledger.batch(1).directory / "committed.json").unlink()

    outcome = commit_table(spark, lake, "sales.orders", "recovering")

    assert outcome.results == [] and outcome.plans[0].recovered == [1]
    assert ledger.batch(1).status == "committed"
    assert [row[0] for row in _duckdb_rows(lake, "sales.orders", "order_id")] == list(range(1, 8))


def test_a_writer_run_for_other_files_than_the_minted_batch_is_refused(lake):
    stream = lake.stream("orders")
    land_events(lake.paths, stream, [order_event(1)])
    batch, _ = mint_next_batch(lake, stream, drain=True)
    land_events(lake.paths, stream, [order_event(2)])

    # The ledger is checked before Spark is touched, so no session is needed to refuse the run.
    with pytest.raises(LakehouseError, match="batch 1 holds 1 files in the ledger, but the run asked for 2"):
        stage_batch(None, lake, stream, batch.sequence, expected_files=[*batch.files, "other.ndjson"])
    assert lake.ledger("orders").batch(1).staged is None
