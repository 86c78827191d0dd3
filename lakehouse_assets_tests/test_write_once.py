"""An append batch is written once: its rows go into a staged snapshot no branch references, and
the commit publishes those same files. Each test injects what can go wrong around the staged
snapshot (a writer that dies after writing it, a duplicate writer, expiry before the commit, an
earlier batch staged as Parquet) and reads the table back with DuckDB against the events landed."""

from pathlib import Path

import pytest

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.catalog.staged_snapshots import WAP_ID_SUMMARY_KEY
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.commit.recovery import lakehouse_commits
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.faults import InjectedFault
from lakehouse_assets.ingest.micro_batching import mint_next_batch
from lakehouse_assets.ingest.staging import stage_batch
from lakehouse_assets.ingest.table_commits import commit_table
from lakehouse_assets.quality.duck import iceberg_connection, scan
from lakehouse_assets_tests.conftest import order_event

pytestmark = pytest.mark.spark


def _order_ids(lake):
    """The table's order ids as DuckDB reads its current snapshot, in order (duplicates kept)."""
    table = lake.table("sales.orders")
    location = lake.metadata_location("sales.orders")
    query = f"SELECT order_id FROM {scan(location, table.current_snapshot().snapshot_id)} ORDER BY 1"
    return [row[0] for row in iceberg_connection().sql(query).fetchall()]


def _land_and_mint(lake, ids):
    stream = lake.stream("orders")
    land_events(lake.paths, stream, [order_event(i) for i in ids])
    batch, _ = mint_next_batch(lake, stream, drain=True)
    return stream, batch


def _data_files(table, snapshot_id):
    """Local paths of the data files the snapshot reads."""
    return {task.file.file_path.removeprefix("file:") for task in table.scan(snapshot_id=snapshot_id).plan_files()}


def test_an_append_batch_is_written_once_and_published_with_its_keys(lake):
    spark = lakehouse_session(lake)
    stream, batch = _land_and_mint(lake, range(1, 41))

    staged = stage_batch(spark, lake, stream, batch.sequence).staged

    table = lake.table("sales.orders")
    assert staged.staged_snapshot is not None and staged.rows == 40
    assert table.current_snapshot() is None, "a staged snapshot is on no branch: readers see nothing"
    written = table.snapshot_by_id(staged.staged_snapshot)
    assert written.summary.additional_properties[WAP_ID_SUMMARY_KEY].startswith("orders:1:")

    outcome = commit_table(spark, lake, "sales.orders", "publish")

    table = lake.table("sales.orders")
    [commit] = lakehouse_commits(table)
    assert (commit.first_sequence, commit.last_sequence, commit.rows) == (1, 1, 40)
    assert outcome.results[0].snapshot_id == table.current_snapshot().snapshot_id
    summary = table.current_snapshot().summary.additional_properties
    assert summary[summary_keys.STREAM] == "orders" and summary["added-records"] == "40"
    # The commit added the writer's own files: nothing was written a second time.
    assert _data_files(table, table.current_snapshot().snapshot_id) == _data_files(table, staged.staged_snapshot)
    assert _order_ids(lake) == list(range(1, 41))


def test_a_writer_that_failed_after_its_staged_snapshot_leaves_it_unpublished(lake, monkeypatch):
    spark = lakehouse_session(lake)
    stream, batch = _land_and_mint(lake, range(1, 31))
    monkeypatch.setenv(faults.FAIL_ENV, faults.WRITER_AFTER_STAGING)
    with pytest.raises(InjectedFault):
        stage_batch(spark, lake, stream, batch.sequence)
    [abandoned] = lake.table("sales.orders").snapshots()
    monkeypatch.delenv(faults.FAIL_ENV)

    # The retried writer stages the batch again (a second staged snapshot); only that one is published.
    staged = stage_batch(spark, lake, stream, batch.sequence).staged
    commit_table(spark, lake, "sales.orders", "publish")

    assert staged.staged_snapshot != abandoned.snapshot_id
    assert _order_ids(lake) == list(range(1, 31))
    table = lake.table("sales.orders")
    assert abandoned.snapshot_id not in {s.snapshot_id for s in table.history()}, "never on main"

    # Expiry removes the abandoned snapshot and its files; the published rows stay, once.
    spark.sql(
        f"CALL lake.system.expire_snapshots(table => 'sales.orders', snapshot_ids => array({abandoned.snapshot_id}))"
    )
    assert lake.table("sales.orders").snapshot_by_id(abandoned.snapshot_id) is None
    assert _order_ids(lake) == list(range(1, 31))


def test_a_staged_snapshot_expired_before_its_commit_is_staged_again_from_the_landing_files(lake):
    spark = lakehouse_session(lake)
    stream, first = _land_and_mint(lake, range(1, 11))
    stage_batch(spark, lake, stream, first.sequence)
    commit_table(spark, lake, "sales.orders", "first")
    _, second = _land_and_mint(lake, range(11, 26))
    staged = stage_batch(spark, lake, stream, second.sequence).staged
    files = _data_files(lake.table("sales.orders"), staged.staged_snapshot) - _data_files(
        lake.table("sales.orders"), lake.table("sales.orders").current_snapshot().snapshot_id
    )

    # The committer was away longer than snapshots are kept: expiry removed the staged snapshot.
    spark.sql(
        f"CALL lake.system.expire_snapshots(table => 'sales.orders', snapshot_ids => array({staged.staged_snapshot}))"
    )
    assert files and not any(Path(path).exists() for path in files), "expiry deleted the staged files"

    outcome = commit_table(spark, lake, "sales.orders", "second")

    assert [(r.first_sequence, r.last_sequence, r.rows) for r in outcome.results] == [(2, 2, 15)]
    assert _order_ids(lake) == list(range(1, 26))


def test_batches_staged_as_parquet_and_written_once_commit_in_order(lake):
    spark = lakehouse_session(lake)
    stream, first = _land_and_mint(lake, range(1, 6))
    # Batch 1 staged as Parquet (as the committer stages a batch again), batch 2 written once.
    stage_batch(spark, lake, stream, first.sequence, into_table=False)
    _, second = _land_and_mint(lake, range(6, 13))
    stage_batch(spark, lake, stream, second.sequence)
    _, third = _land_and_mint(lake, range(13, 16))
    stage_batch(spark, lake, stream, third.sequence)

    outcome = commit_table(spark, lake, "sales.orders", "mixed")

    assert [(r.first_sequence, r.last_sequence, r.rows) for r in outcome.results] == [(1, 1, 5), (2, 3, 10)]
    assert _order_ids(lake) == list(range(1, 16))
