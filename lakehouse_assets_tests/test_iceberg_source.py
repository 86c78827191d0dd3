"""The Iceberg CDC source end to end: a source table that Spark changes (copy-on-write and
merge-on-read) -> its change events -> the downstream table, equal to the source after every sync
(read by DuckDB), through compaction, a schema change, a crash and an expired checkpoint."""

import json
import signal

import dagster as dg
import pytest

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import list_landing_files
from lakehouse_assets.cli.main import main as lakehouse_main
from lakehouse_assets.cli.status import lakehouse_status
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.quality.duck import iceberg_connection
from lakehouse_assets.runner import run_pipeline_until_idle
from lakehouse_assets_tests.conftest import write_config
from lakehouse_assets_tests.fault_injection.pipeline import run_pipeline

pytestmark = pytest.mark.spark

SYNC = {
    "name": "accounts_sync",
    "source": {"iceberg": {"table": "src.accounts", "identifier_columns": ["id"], "polling_interval": "1s"}},
    "table_identifier": "mirror.accounts",
    "auto_create": True,
    "schema_evolution": True,
    "commit_interval": "0s",
    "flush": {"max_bytes": 1},
}
WRITE_MODES = ["copy-on-write", "merge-on-read"]


def _create_source(spark, mode: str) -> None:
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.src")
    spark.sql(
        "CREATE TABLE lake.src.accounts (id bigint NOT NULL, name string, balance decimal(10,2), region string) "
        "USING iceberg PARTITIONED BY (region) TBLPROPERTIES ('format-version' = '2', "
        f"'write.delete.mode' = '{mode}', 'write.update.mode' = '{mode}', 'write.merge.mode' = '{mode}')"
    )


def _rows(lake, identifier: str, columns: str) -> list[tuple]:
    location = lake.metadata_location(identifier)
    return iceberg_connection().sql(f"SELECT {columns} FROM iceberg_scan('{location}') ORDER BY id").fetchall()


def _sync_and_compare(lake, columns: str = "id, name, balance, region") -> None:
    with dg.DagsterInstance.get() as instance:
        assert run_pipeline_until_idle(instance, log=lambda _: None).failed == []
    assert _rows(lake, "mirror.accounts", columns) == _rows(lake, "src.accounts", columns)


@pytest.fixture
def with_source(lakehouse_home, tmp_path, monkeypatch, request):
    write_config(tmp_path, {"streams": [SYNC]}, monkeypatch)
    lake = Lakehouse.from_env()
    spark = lakehouse_session(lake)
    _create_source(spark, getattr(request, "param", "copy-on-write"))
    return lake, spark


@pytest.mark.parametrize("with_source", WRITE_MODES, indirect=True)
def test_the_downstream_table_equals_the_source_after_every_change(with_source):
    lake, spark = with_source
    spark.sql(
        "INSERT INTO lake.src.accounts VALUES (1, 'ada', 10.00, 'eu'), (2, 'bob', 20.00, 'us'), "
        "(3, 'cy', 30.00, 'eu'), (4, 'di', 40.00, 'us')"
    )
    _sync_and_compare(lake)  # the initial load

    spark.sql("UPDATE lake.src.accounts SET balance = 21.50 WHERE id = 2")
    spark.sql("DELETE FROM lake.src.accounts WHERE id = 3")
    spark.sql("INSERT INTO lake.src.accounts VALUES (5, 'ed', 50.00, 'eu')")
    _sync_and_compare(lake)  # three snapshots, in order

    spark.sql(
        "MERGE INTO lake.src.accounts t USING (SELECT 1 AS id, 'ada' AS name, 11.00 AS balance, 'eu' AS region "
        "UNION ALL SELECT 6, 'fay', 60.00, 'us') s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET t.balance = s.balance WHEN NOT MATCHED THEN INSERT *"
    )
    changed = lake.table("src.accounts").current_snapshot().snapshot_id
    _sync_and_compare(lake)
    summary = lake.table("mirror.accounts").current_snapshot().summary
    assert summary.additional_properties[summary_keys.SOURCE_SNAPSHOT] == str(changed)

    spark.sql("CALL lake.system.rewrite_data_files(table => 'src.accounts', options => map('min-input-files', '1'))")
    before = lake.table("mirror.accounts").current_snapshot().snapshot_id
    _sync_and_compare(lake)  # compaction: nothing to apply
    assert lake.table("mirror.accounts").current_snapshot().snapshot_id == before

    # A new column, and a column the source widened (as Iceberg allows) for a value only the wider
    # type holds: the mirror promotes its own column for that value.
    spark.sql("ALTER TABLE lake.src.accounts ADD COLUMN tier string")
    spark.sql("ALTER TABLE lake.src.accounts ALTER COLUMN balance TYPE decimal(12,2)")
    spark.sql("UPDATE lake.src.accounts SET tier = 'gold' WHERE id = 1")
    spark.sql("INSERT INTO lake.src.accounts VALUES (7, 'gus', 1234567890.12, 'us', 'silver')")
    spark.sql("DELETE FROM lake.src.accounts WHERE region = 'eu' AND id = 5")
    _sync_and_compare(lake, "id, name, balance, region, tier")
    assert str(lake.table("mirror.accounts").schema().find_type("balance")) == "decimal(12, 2)"

    events = [
        json.loads(line)
        for landed in list_landing_files(lake.paths.landing("accounts_sync"))
        for line in (lake.paths.landing("accounts_sync") / landed.name).open()
    ]
    deleted = next(event for event in events if event["iceberg_operation"] == "DELETE" and event["id"] == 3)
    assert (deleted["bulk_action"], deleted["document_id"]) == ("DELETE", "3")
    assert deleted["iceberg_table_name"] == "src.accounts"
    updates = [event for event in events if event["id"] == 2 and event["iceberg_operation"] == "UPDATE_AFTER"]
    assert [event["balance"] for event in updates] == [21.5]  # one INDEX per key and snapshot, no UPDATE_BEFORE

    bulk = "".join(path.read_text() for path in sorted(lake.paths.exports("accounts_sync").iterdir()))
    assert '{"delete": {"_id": "3"}}' in bulk and '{"index": {"_id": "6"}}' in bulk


# Merge-on-read only: the crash is the checkpoint's, whichever way the source wrote its changes
# (their reading in both modes is the test above), and this mode's delete files are the harder read.
@pytest.mark.parametrize("with_source", ["merge-on-read"], indirect=True)
def test_a_crash_after_emitting_before_the_checkpoint_applies_each_change_once(with_source):
    lake, spark = with_source
    spark.sql("INSERT INTO lake.src.accounts VALUES (1, 'ada', 10.00, 'eu'), (2, 'bob', 20.00, 'us')")
    _sync_and_compare(lake)
    spark.sql("UPDATE lake.src.accounts SET balance = balance + 1")
    spark.sql("INSERT INTO lake.src.accounts VALUES (3, 'cy', 30.00, 'eu')")

    crashed = run_pipeline({faults.CRASH_ENV: faults.SOURCE_AFTER_EMIT})
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    restarted = run_pipeline()

    assert restarted.returncode == 0, restarted.stdout[-2000:] + restarted.stderr[-2000:]
    columns = "id, name, balance, region"
    assert _rows(lake, "mirror.accounts", columns) == _rows(lake, "src.accounts", columns)
    names = [landed.name for landed in list_landing_files(lake.paths.landing("accounts_sync"))]
    assert len(names) == len(set(names)) == 3  # the load and one file per change snapshot, none twice


def test_an_expired_checkpoint_fails_loudly_and_a_reload_converges(with_source):
    lake, spark = with_source
    spark.sql("INSERT INTO lake.src.accounts VALUES (1, 'ada', 10.00, 'eu'), (2, 'bob', 20.00, 'us')")
    _sync_and_compare(lake)
    spark.sql("DELETE FROM lake.src.accounts WHERE id = 1")
    spark.sql("INSERT INTO lake.src.accounts VALUES (3, 'cy', 30.00, 'eu')")
    spark.sql(
        "CALL lake.system.expire_snapshots(table => 'src.accounts', "
        "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)"
    )

    with dg.DagsterInstance.get() as instance:
        report = run_pipeline_until_idle(instance, log=lambda _: None)
        [failed] = report.failed
        [run] = instance.get_runs(dg.RunsFilter(run_ids=[failed.rsplit(" ", 1)[-1]]))
        logs = instance.all_logs(run.run_id)
        failure = next(e for e in logs if e.is_dagster_event and e.dagster_event.is_step_failure)
    message = failure.dagster_event.step_failure_data.error.cause.message
    assert "has expired" in message and "lakehouse source reload --stream accounts_sync" in message

    assert lakehouse_main(["source", "reload", "--stream", "accounts_sync"]) == 0
    _sync_and_compare(lake)  # id 1 is deleted downstream by the reload, id 3 added
    assert [row[0] for row in _rows(lake, "mirror.accounts", "id")] == [2, 3]


def test_disable_export_starts_from_the_current_snapshot(lakehouse_home, tmp_path, monkeypatch):
    stream = {**SYNC, "source": {"iceberg": {**SYNC["source"]["iceberg"], "disable_export": True}}}
    write_config(tmp_path, {"streams": [stream]}, monkeypatch)
    lake = Lakehouse.from_env()
    spark = lakehouse_session(lake)
    _create_source(spark, "copy-on-write")
    spark.sql("INSERT INTO lake.src.accounts VALUES (1, 'ada', 10.00, 'eu')")
    with dg.DagsterInstance.get() as instance:
        assert run_pipeline_until_idle(instance, log=lambda _: None).failed == []
    spark.sql("INSERT INTO lake.src.accounts VALUES (2, 'bob', 20.00, 'us')")
    with dg.DagsterInstance.get() as instance:
        assert run_pipeline_until_idle(instance, log=lambda _: None).failed == []

    assert _rows(lake, "mirror.accounts", "id, name") == [(2, "bob")]


def test_a_source_in_another_catalog_is_synced(lakehouse_home, tmp_path, monkeypatch):
    source = {**SYNC["source"]["iceberg"], "catalog": {"type": "hadoop", "warehouse": str(tmp_path / "other")}}
    write_config(tmp_path, {"streams": [{**SYNC, "source": {"iceberg": source}}]}, monkeypatch)
    lake = Lakehouse.from_env()
    spark = lakehouse_session(lake)
    spark.sql("CREATE NAMESPACE IF NOT EXISTS source_accounts_sync.src")
    spark.sql("CREATE TABLE source_accounts_sync.src.accounts (id bigint NOT NULL, name string) USING iceberg")
    spark.sql("INSERT INTO source_accounts_sync.src.accounts VALUES (1, 'ada'), (2, 'bob')")
    spark.sql("UPDATE source_accounts_sync.src.accounts SET name = 'bea' WHERE id = 2")
    with dg.DagsterInstance.get() as instance:
        assert run_pipeline_until_idle(instance, log=lambda _: None).failed == []
    spark.sql("DELETE FROM source_accounts_sync.src.accounts WHERE id = 1")
    with dg.DagsterInstance.get() as instance:
        assert run_pipeline_until_idle(instance, log=lambda _: None).failed == []

    assert lake.table("src.accounts") is None  # not in catalog lake
    source_rows = _rows(lake.source(lake.stream("accounts_sync")), "src.accounts", "id, name")
    assert _rows(lake, "mirror.accounts", "id, name") == source_rows == [(2, "bea")]
    [entry] = lakehouse_status(lake, None)
    [progress] = entry["streams"]
    assert progress["source_snapshot_synced"] == progress["source_snapshot_current"] is not None
