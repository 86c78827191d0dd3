"""One test per dead-letter reason: each bad event lands in its dead-letter table with its reason,
next to good events that commit, after one real pipeline run over four kinds of stream."""

from __future__ import annotations

import json
from collections.abc import Iterator

import dagster as dg
import pytest
import yaml

from lakehouse_assets.batches.landing import landing_dir, write_landing_file
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.runner import run_pipeline_until_idle

pytestmark = pytest.mark.spark

FAST = {"commit_interval": "0s", "flush": {"max_bytes": 1}}
STREAMS = [
    {
        "name": "orders",
        "table_identifier": "sales.orders",
        "auto_create": True,
        "schema": {
            "columns": [{"name": "order_id", "type": "long", "required": True}, {"name": "note", "type": "string"}]
        },
        **FAST,
    },
    {
        "name": "customers",
        "table_identifier": "crm.customers",
        "auto_create": True,
        "operation": "${/op}",
        "identifier_columns": ["id"],
        "schema": {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"}]},
        **FAST,
    },
    {
        "name": "accounts",
        "source": {"landing": {"format": "debezium"}},
        "table_identifier": "crm.accounts",
        "auto_create": True,
        "identifier_columns": ["id"],
        "schema": {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"}]},
        **FAST,
    },
    {"name": "routed", "table_identifier": "${/db}.${/table}", **FAST},
]
# (stream, event line, dead-letter table, the reason it gets)
CASES = [
    ("orders", "not json", "sales.orders_dead_letters", "not a JSON object"),
    ("orders", '{"unknown": 1}', "sales.orders_dead_letters", "no field matches the table schema"),
    ("orders", '{"note": "n"}', "sales.orders_dead_letters", "missing required field 'order_id'"),
    ("orders", '{"order_id": "abc"}', "sales.orders_dead_letters", "required field 'order_id': abc is not a bigint"),
    ("customers", '{"op": "merge", "id": 1}', "crm.customers_dead_letters", "unrecognized operation 'merge'"),
    ("customers", '{"op": "c", "name": "x"}', "crm.customers_dead_letters", "missing identifier column 'id'"),
    (
        "customers",
        '{"op": "c", "id": "abc"}',
        "crm.customers_dead_letters",
        "identifier column 'id': abc is not a bigint",
    ),
    ("accounts", '{"op": "c", "after": null}', "crm.accounts_dead_letters", "Debezium change without an 'after' row"),
    ("accounts", '{"op": "d", "before": null}', "crm.accounts_dead_letters", "Debezium delete without a 'before' row"),
    (
        "routed",
        '{"table": "contacts", "id": 2}',
        "lakehouse.routed_dead_letters",
        "table_identifier ${/db}.${/table}: a field it points to is missing or null",
    ),
    (
        "routed",
        '{"db": "crm", "table": "con tacts"}',
        "lakehouse.routed_dead_letters",
        "table_identifier ${/db}.${/table}: 'crm.con tacts' is not namespace.table",
    ),
    (
        "routed",
        '{"db": "crm", "table": "a__b"}',
        "lakehouse.routed_dead_letters",
        "table_identifier ${/db}.${/table}: 'crm.a__b' is reserved",
    ),
    (
        "routed",
        '{"db": "crm", "table": "nope"}',
        "lakehouse.routed_dead_letters",
        "table_identifier ${/db}.${/table}: table crm.nope does not exist and auto_create is false",
    ),
]
GOOD_EVENTS = {
    "orders": ('{"order_id": 1, "note": "ok"}', "sales.orders"),
    "customers": ('{"op": "c", "id": 1, "name": "a"}', "crm.customers"),
    "accounts": ('{"op": "c", "after": {"id": 1, "name": "a"}}', "crm.accounts"),
    "routed": ('{"db": "crm", "table": "contacts", "id": 1, "name": "a"}', "crm.contacts"),
}


@pytest.fixture(scope="module")
def dead_letters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[dict]]]:
    """Land every case and a good event per stream, run the pipeline once, read the dead letters."""
    root = tmp_path_factory.mktemp("reasons")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("LAKEHOUSE_HOME", str(root / "lakehouse"))
        monkeypatch.setenv("DAGSTER_HOME", str(root / "dagster"))
        monkeypatch.setenv("LAKEHOUSE_CONFIG", str(root / "lakehouse.yaml"))
        (root / "dagster").mkdir()
        (root / "lakehouse.yaml").write_text(yaml.safe_dump({"streams": STREAMS}))
        lake = Lakehouse.from_env()
        spark = lakehouse_session(lake)
        spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.crm")
        spark.sql("CREATE TABLE lake.crm.contacts (id bigint, name string) USING iceberg")
        for stream in lake.config.streams:
            lines = [event for name, event, _, _ in CASES if name == stream.name] + [GOOD_EVENTS[stream.name][0]]
            write_landing_file(landing_dir(lake.paths, stream), [f"{line}\n".encode() for line in lines])
        with dg.DagsterInstance.get() as instance:
            assert run_pipeline_until_idle(instance, log=lambda _: None).failed == []
        lake = Lakehouse.from_env()
        tables = {table for _, _, table, _ in CASES} | {table for _, table in GOOD_EVENTS.values()}
        yield {table: _rows(lake, table) for table in tables}


def _rows(lake, identifier: str) -> list[dict]:
    table = lake.table(identifier)
    return table.scan().to_arrow().to_pylist() if table else []


@pytest.mark.parametrize(("stream", "event", "table", "reason"), CASES, ids=[case[3][:60] for case in CASES])
def test_each_bad_event_is_a_dead_letter_with_its_reason(dead_letters, stream, event, table, reason):
    [row] = [row for row in dead_letters[table] if row["event"] == event]
    assert (row["stream"], row["source_line"]) == (stream, 1 + [c[1] for c in CASES if c[0] == stream].index(event))
    assert row["reason"].startswith(reason)


def test_only_the_bad_events_are_dead_letters_and_the_good_ones_commit(dead_letters):
    for table in {table for _, _, table, _ in CASES}:
        assert sorted(row["event"] for row in dead_letters[table]) == sorted(c[1] for c in CASES if c[2] == table)
    for stream, (event, table) in GOOD_EVENTS.items():
        rows = dead_letters[table]
        expected = json.loads(event)
        key = "order_id" if stream == "orders" else "id"
        assert [row[key] for row in rows] == [expected.get(key) or expected["after"][key]], stream
