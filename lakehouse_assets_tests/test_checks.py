"""The DuckDB checks fail, and say what they found, when a table is corrupted on purpose."""

import dagster as dg
import pytest

from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.defs.sensors import writer_run_request
from lakehouse_assets.engine.local_rows import rows_frame
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.ingest.micro_batching import mint_next_batch
from lakehouse_assets.quality import checks
from lakehouse_assets.quality.duck import iceberg_connection
from lakehouse_assets.runner import IN_PROCESS_SPARK, run_until_idle
from lakehouse_assets_tests.conftest import order_event

pytestmark = pytest.mark.spark


@pytest.fixture
def committed_orders(lake, instance):
    land_events(lake.paths, lake.stream("orders"), [order_event(i) for i in range(1, 51)])
    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []
    return lakehouse_session(lake)


def _current(lake):
    table = lake.table("sales.orders")
    location = lake.metadata_location("sales.orders")
    return checks.CommittedSnapshot(location, table.current_snapshot().snapshot_id)


def test_a_foreign_row_fails_the_row_count_check_in_the_dagster_ui(committed_orders, lake, instance):
    committed_orders.sql("INSERT INTO lake.sales.orders VALUES (999, 1, 1.0, current_timestamp())")
    land_events(lake.paths, lake.stream("orders"), [order_event(i) for i in range(51, 61)])

    report = run_until_idle(build_definitions(lake.config), instance, log=lambda _: None)

    # The check is blocking: the run that committed (the writer run) fails, so nothing downstream
    # reads the bad table.
    assert [label.split()[0] for label in report.failed] == ["orders_stage_job"]

    key = dg.AssetCheckKey(names.table_key("sales.orders"), names.ROW_COUNT_CHECK)
    record = instance.get_latest_asset_check_evaluation_record(key)
    assert record.status.value == "FAILED"
    evaluation = record.event.dagster_event.event_specific_data
    assert evaluation.metadata["rows_read"].value == 61
    assert evaluation.metadata["rows_staged"].value == 60


def test_a_gap_in_batch_ranges_fails_the_sequence_check(committed_orders, lake):
    row = {"order_id": 1000, "customer_id": 1, "amount": 1.0}
    (
        rows_frame(committed_orders, [row], "order_id long, customer_id long, amount double, ts timestamp")
        .writeTo("lake.sales.orders")
        .option("snapshot-property.lakehouse.stream", "orders")
        .option("snapshot-property.lakehouse.batch-range", "5-5")
        .option("snapshot-property.lakehouse.rows", "1")
        .append()
    )
    outcome = checks.check_sequence_ranges(_current(lake))
    assert not outcome.passed
    assert "stream orders: gap: range 5-5 after 1" in outcome.description


def test_a_schema_change_fails_the_schema_check(committed_orders, lake):
    committed_orders.sql("ALTER TABLE lake.sales.orders ADD COLUMN coupon string")
    committed_orders.sql("INSERT INTO lake.sales.orders VALUES (1001, 1, 1.0, current_timestamp(), 'x')")
    outcome = checks.check_schema(iceberg_connection(), _current(lake), lake.stream("orders").table_schema.columns)
    assert not outcome.passed
    assert "coupon" in outcome.description


def test_a_data_file_referenced_twice_fails_the_data_file_check(committed_orders, lake):
    jvm = committed_orders.sparkContext._jvm
    table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
        committed_orders._jsparkSession, "lake.sales.orders"
    )
    data_file = table.currentSnapshot().addedDataFiles(table.io()).iterator().next()
    table.newFastAppend().appendFile(data_file).commit()
    outcome = checks.check_unique_data_files(iceberg_connection(), _current(lake))
    assert not outcome.passed
    assert outcome.metadata["duplicated"] == [data_file.location()]


def test_every_check_passes_on_a_healthy_table(committed_orders, lake):
    snapshot = _current(lake)
    connection = iceberg_connection()
    declared = lake.stream("orders").table_schema.columns
    for outcome in (
        checks.check_schema(connection, snapshot, declared),
        checks.check_row_count(connection, snapshot),
        checks.check_sequence_ranges(snapshot),
        checks.check_unique_data_files(connection, snapshot),
    ):
        assert outcome.passed, outcome.description


def test_a_table_materialized_with_its_checks_as_the_ui_does_is_checked_once_in_the_check_step(
    committed_orders, lake, instance
):
    land_events(lake.paths, lake.stream("orders"), [order_event(i) for i in range(51, 61)])
    repository = build_definitions(lake.config).get_repository_def()
    key = names.table_key("sales.orders")
    checks_of_table = {check for check in repository.asset_graph.asset_check_keys if check.asset_key == key}
    # The writer stages the batch; the UI's "Materialize" of the table then plans its checks too.
    staged = repository.get_implicit_global_asset_job_def().get_subset(
        asset_selection={names.staged_batches_key("orders")}
    )
    batch, _ = mint_next_batch(lake, lake.stream("orders"), drain=True)
    # Spark in this process, as ``lakehouse run`` has it: where the engine runs is not this test's
    # subject (``test_spark_host.py`` runs these steps on the host).
    writer_config = {**writer_run_request(batch).run_config, "resources": IN_PROCESS_SPARK}
    assert staged.execute_in_process(instance=instance, run_config=writer_config).success

    job = repository.get_implicit_global_asset_job_def().get_subset(
        asset_selection={key}, asset_check_selection=checks_of_table
    )
    result = job.execute_in_process(instance=instance, run_config={"resources": IN_PROCESS_SPARK}, raise_on_error=False)

    assert result.success
    [materialization] = result.asset_materializations_for_node(key.to_python_identifier())
    evaluations = result.get_asset_check_evaluations()
    assert sorted(evaluation.check_name for evaluation in evaluations) == sorted(c.name for c in checks_of_table)
    blocking = [e for e in evaluations if e.check_name in names.CHECK_NAMES]
    assert all(
        e.passed and e.metadata["snapshot_id"].value == materialization.metadata["snapshot_id"].value for e in blocking
    )
