"""Dynamic routing through the real pipeline: one stream, several auto-created tables, every event
accounted for in a table or a dead-letter table."""

import json
import shutil
from pathlib import Path

import pytest

from lakehouse_assets.config import load_config
from lakehouse_assets.landing import landing_dir
from lakehouse_assets.runner import run_pipeline_until_idle
from lakehouse_assets.table_metadata import load_committed_table
from lakehouse_assets_tests.conftest import write_config
from lakehouse_assets_tests.test_pipeline import _duckdb_rows

pytestmark = pytest.mark.spark

FIXTURES = Path(__file__).parent / "fixtures"
ROUTED = {
    "name": "app_events",
    "table_identifier": "${/source/db}.${/source/table}",
    "auto_create": True,
    "schema_evolution": True,
    "commit_interval": "0s",
    "flush": {"max_bytes": 1},
}
ROUTER_DEAD_LETTERS = "lakehouse.app_events_dead_letters"


@pytest.fixture
def routed(lakehouse_home, tmp_path, monkeypatch):
    write_config(tmp_path, {"streams": [ROUTED]}, monkeypatch)
    return load_config()


def drop_landing_files(config, paths, *names: str) -> None:
    """Copy fixture files into the router's landing directory, as a producer would drop them."""
    directory = landing_dir(paths, config.stream("app_events"))
    directory.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(names):
        shutil.copy(FIXTURES / name, directory / f".{name}.tmp")
        (directory / f".{name}.tmp").rename(directory / f"{index:04d}-{name}")


def table_rows(config, paths, identifier: str) -> list[dict]:
    table = load_committed_table(config, paths, identifier)
    return table.scan().to_arrow().to_pylist() if table else []


def test_messy_events_route_to_auto_created_tables_and_every_event_is_accounted_for(routed, paths, instance):
    drop_landing_files(routed, paths, "messy_events_1.ndjson", "messy_events_2.ndjson")

    report = run_pipeline_until_idle(instance, log=lambda _: None)

    assert report.failed == []
    tables = {"shop.orders": 7, "shop.customers": 4, "web.page_views": 4, "web.signups": 2}
    rows = {identifier: table_rows(routed, paths, identifier) for identifier in tables}
    assert {identifier: len(found) for identifier, found in rows.items()} == tables
    dead_letters = table_rows(routed, paths, ROUTER_DEAD_LETTERS)
    landed = [line for name in ("messy_events_1.ndjson", "messy_events_2.ndjson") for line in (FIXTURES / name).open()]
    placed = sorted(row["event_id"] for found in rows.values() for row in found)
    rejected = sorted(json.loads(row["event"])["event_id"] for row in dead_letters if row["event"].startswith("{"))
    assert sorted(placed + rejected) == [json.loads(line)["event_id"] for line in landed if line.startswith("{")]
    assert len(dead_letters) == 5 and len(set(placed)) == len(placed)
    reasons = {row["source_line"]: row["reason"] for row in dead_letters}
    assert "a field it points to is missing" in reasons[6] and "not namespace.table" in reasons[8]
    assert reasons[11] == "event is not a JSON object"

    orders = {row["order_id"]: row for row in rows["shop.orders"]}
    assert orders[1002]["amount"] == pytest.approx(19.99) and orders[1003]["amount"] is None
    assert orders[1007]["coupon"] == "WELCOME10" and orders[1008]["shipping"] == {"method": "ups", "days": None}
    customers = {row["customer_id"]: row for row in rows["shop.customers"]}
    assert customers[None]["name"] == "Bob"  # "eight" is not a long: NULL in an optional column
    assert customers[8]["address"]["zip"] == "0150" and customers[9]["address"] == {
        "city": "Rome",
        "country": None,
        "zip": "184",
    }
    signups = {row["email"]: row for row in rows["web.signups"]}
    assert signups["d@example.com"]["utm"] == {"source": "ads", "campaign": "bf"}

    # DuckDB, an independent reader, sees the same tables through the Iceberg metadata.
    for identifier, count in tables.items():
        assert _duckdb_rows(routed, paths, identifier, "count(*)") == [(count,)]
