"""``lakehouse check``: the blocking checks on each table's current snapshot, as a Dagster run,
exiting 1 while one fails and 0 once the table is fixed."""

import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from pyspark.sql import functions as F

from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.runner import run_until_idle
from lakehouse_assets.runtime.run_liveness import RUN_KIND_TAG
from lakehouse_assets_tests.conftest import write_config

pytestmark = pytest.mark.spark

LAKEHOUSE = Path(sys.executable).parent / "lakehouse"
CUSTOMERS_STREAM = {
    "name": "customers",
    "source": {"landing": {}},
    "table_identifier": "crm.customers",
    "operation": "${/op}",
    "identifier_columns": ["id"],
    "auto_create": True,
    "schema": {
        "columns": [
            {"name": "id", "type": "long", "required": True},
            {"name": "name", "type": "string"},
        ]
    },
    "table_properties": {"format-version": "2"},
    "flush": {"max_bytes": 1, "max_age": "60s"},
    "commit_interval": "0s",
}


def _lakehouse_check(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LAKEHOUSE), "check", *arguments], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture
def customers(lakehouse_home, instance, tmp_path, monkeypatch):
    """A keyed table committed by the pipeline: two change batches, the second an update and a delete."""
    write_config(tmp_path, {"streams": [CUSTOMERS_STREAM]}, monkeypatch)
    lake = Lakehouse.from_env()
    stream = lake.stream("customers")
    land_events(lake.paths, stream, [json.dumps({"op": "c", "id": key, "name": f"c{key}"}) for key in range(1, 6)])
    land_events(lake.paths, stream, [json.dumps({"op": "u", "id": 2, "name": "b"}), json.dumps({"op": "d", "id": 4})])
    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []
    return lake


def test_a_planted_duplicate_key_fails_lakehouse_check_in_a_recorded_run_until_it_is_removed(
    customers, instance, tmp_path
):
    spark = lakehouse_session(customers)
    planted = spark.table("lake.crm.customers").where("id = 3").withColumn("name", F.lit("planted"))
    planted.writeTo("lake.crm.customers").append()

    failing = _lakehouse_check(cwd=tmp_path)

    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "crm.customers identifier_keys_unique: FAILED: 1 keys appear more than once" in failing.stdout
    assert "crm.customers data_files_unique: passed" in failing.stdout
    [run] = instance.get_runs(filters=dg.RunsFilter(job_name=names.check_job_name("crm.customers")))
    assert run.status == dg.DagsterRunStatus.FAILURE
    assert run.tags[RUN_KIND_TAG] == "check"
    key = dg.AssetCheckKey(names.table_key("crm.customers"), names.KEYS_UNIQUE_CHECK)
    record = instance.get_latest_asset_check_evaluation_record(key)
    assert (record.run_id, record.status.value) == (run.run_id, "FAILED")
    assert record.event.dagster_event.event_specific_data.metadata["duplicated_keys"].value == ["(3,)"]

    spark.sql("DELETE FROM lake.crm.customers WHERE name = 'planted'")
    fixed = _lakehouse_check("--table", "crm.customers", cwd=tmp_path)

    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "crm.customers identifier_keys_unique: passed" in fixed.stdout
    assert "every blocking check passed" in fixed.stdout
    assert instance.get_latest_asset_check_evaluation_record(key).status.value == "SUCCEEDED"


def test_an_unknown_table_is_named(lakehouse_home, tmp_path):
    unknown = _lakehouse_check("--table", "crm.nobody", cwd=tmp_path)

    assert unknown.returncode == 2
    assert "unknown table 'crm.nobody'; configured tables: sales.orders" in unknown.stderr
