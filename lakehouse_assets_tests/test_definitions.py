"""The definitions load the way ``dagster dev`` loads them, with pinned names."""

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import dagster as dg
import pytest
from alembic.script import ScriptDirectory
from dagster._core.storage.event_log.sqlite import sqlite_event_log
from dagster._core.storage.sql import get_alembic_config

from lakehouse_assets.definitions import build_definitions, defs
from lakehouse_assets.errors import TableNotFoundError
from lakehouse_assets_tests.conftest import ORDERS_STREAM, write_config

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def test_workspace_yaml_loads_the_code_location(lakehouse_home):
    completed = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "lakehouse_assets" in completed.stdout + completed.stderr


def test_asset_check_job_and_sensor_names_are_pinned(config):
    repository = build_definitions(config).get_repository_def()
    assert repository.asset_graph.get_all_asset_keys() == {
        dg.AssetKey(["staging", "orders_batches"]),
        dg.AssetKey(["sales", "orders"]),
    }
    assert {key.name for key in repository.asset_graph.asset_check_keys} == {
        "schema_matches_declared",
        "rows_reconcile_with_batches",
        "batch_ranges_contiguous",
        "data_files_unique",
        "lag_within_bound",
        "no_new_dead_letters",
    }
    assert {job.name for job in repository.get_all_jobs()} >= {
        "orders_stage_job",
        "sales_orders_commit_job",
        "sales_orders_maintenance_job",
        "sales_orders_freshness_job",
        "sales_orders_check_job",
    }
    assert {schedule.name for schedule in repository.schedule_defs} == {
        "sales_orders_maintenance_schedule",
        "sales_orders_freshness_schedule",
    }
    assert {sensor.name for sensor in repository.sensor_defs} == {
        "orders_landing_sensor",
        "sales_orders_staged_batches_sensor",
    }


def test_a_missing_table_that_may_not_be_created_stops_the_code_location_loading(lakehouse_home, tmp_path, monkeypatch):
    write_config(tmp_path, {"streams": [{**ORDERS_STREAM, "auto_create": False}]}, monkeypatch)

    with pytest.raises(TableNotFoundError, match=r"sales\.orders \(streams orders\)"):
        defs()


def test_the_tables_one_router_feeds_add_assets_and_checks_but_no_sensor_or_job_per_table(
    lakehouse_home, tmp_path, monkeypatch
):
    router = {"name": "tenants", "table_identifier": "t.${/tenant}", "auto_create": True}
    write_config(tmp_path, {"streams": [router]}, monkeypatch)
    tables = [f"t.tenant_{index:03d}" for index in range(300)]
    for table in tables:
        (lakehouse_home / "routes" / "tenants" / table).mkdir(parents=True)

    repository = defs().get_repository_def()

    assert repository.asset_graph.get_all_asset_keys() >= {dg.AssetKey(["t", table[2:]]) for table in tables}
    checked = {key.asset_key for key in repository.asset_graph.asset_check_keys}
    assert checked == {dg.AssetKey(["t", table[2:]]) for table in tables}
    assert len(repository.asset_graph.asset_check_keys) == 6 * len(tables)
    assert {sensor.name for sensor in repository.sensor_defs} == {
        "tenants_landing_sensor",
        "tenants_routed_tables_sensor",
    }
    assert {job.name for job in repository.get_all_jobs()} == {
        "tenants_stage_job",
        "tenants_routed_commit_job",
        "tenants_routed_check_job",
        "tenants_routed_freshness_job",
        "tenants_routed_maintenance_job",
        "__ASSET_JOB",
    }
    assert {schedule.name for schedule in repository.schedule_defs} == {
        "tenants_routed_freshness_schedule",
        "tenants_routed_maintenance_schedule",
    }


@dg.op
def _nothing() -> None:
    """A step that does nothing: its run only records events."""


@dg.job
def _one_step() -> None:
    _nothing()


def test_dagster_storage_reads_its_migration_scripts_once_and_still_stamps_each_run(tmp_path, config):
    build_definitions(config)  # as every process that runs the definitions does
    alembic_config = get_alembic_config(sqlite_event_log.__file__)
    assert ScriptDirectory.from_config(alembic_config) is ScriptDirectory.from_config(alembic_config)

    # Each run's own event-log database is created and stamped at the scripts' head revision.
    head = ScriptDirectory.from_config(alembic_config).get_current_head()
    with dg.DagsterInstance.local_temp(str(tmp_path)) as instance:
        for _ in range(2):
            run_id = _one_step.execute_in_process(instance=instance).run_id
            shard = instance.event_log_storage.path_for_shard(run_id)  # type: ignore[attr-defined]
            with closing(sqlite3.connect(shard)) as connection:
                assert connection.execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]
