"""Dynamic routing through the real pipeline: one stream, several auto-created tables, every event
accounted for in a table or a dead-letter table."""

import json
import shutil
import signal
from pathlib import Path

import dagster as dg
import pytest

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import land_events, landing_dir, list_landing_files
from lakehouse_assets.batches.ledger import EVENTS_DIR, StreamLedger
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.config.loader import load_config
from lakehouse_assets.config.routed_streams import routed_stream_name
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.defs.check_status import latest_evaluation
from lakehouse_assets.defs.sensors import writer_run_request
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.ingest.micro_batching import mint_next_batch
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.ops.replay import replay_dead_letters
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.runner import run_job, run_pipeline_until_idle
from lakehouse_assets_tests.conftest import write_config
from lakehouse_assets_tests.fault_injection.pipeline import run_lakehouse, run_pipeline
from lakehouse_assets_tests.fault_injection.template_homes import FIRST_ROUND_TEMPLATE, restored_home, use_home
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


def drop_landing_files(lake, *names: str) -> None:
    """Copy fixture files into the router's landing directory, as a producer would drop them."""
    directory = landing_dir(lake.paths, lake.stream("app_events"))
    directory.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(names):
        shutil.copy(FIXTURES / name, directory / f".{name}.tmp")
        (directory / f".{name}.tmp").rename(directory / f"{index:04d}-{name}")


def table_rows(lake, identifier: str) -> list[dict]:
    table = lake.table(identifier)
    return table.scan().to_arrow().to_pylist() if table else []


MESSY_FILES = ("messy_events_1.ndjson", "messy_events_2.ndjson")
MESSY_TABLES = {"shop.orders": 7, "shop.customers": 4, "web.page_views": 4, "web.signups": 2}


def assert_every_messy_event_is_accounted_for(lake) -> dict[str, list[dict]]:
    """Each fixture event is in exactly one table or in the router's dead letters; returns the rows."""
    rows = {identifier: table_rows(lake, identifier) for identifier in MESSY_TABLES}
    assert {identifier: len(found) for identifier, found in rows.items()} == MESSY_TABLES
    dead_letters = table_rows(lake, ROUTER_DEAD_LETTERS)
    landed = [line for name in MESSY_FILES for line in (FIXTURES / name).open()]
    placed = sorted(row["event_id"] for found in rows.values() for row in found)
    rejected = sorted(json.loads(row["event"])["event_id"] for row in dead_letters if row["event"].startswith("{"))
    assert sorted(placed + rejected) == [json.loads(line)["event_id"] for line in landed if line.startswith("{")]
    assert len(dead_letters) == 5 and len(set(placed)) == len(placed)
    # DuckDB, an independent reader, sees the same tables through the Iceberg metadata.
    for identifier, count in MESSY_TABLES.items():
        assert _duckdb_rows(lake, identifier, "count(*)") == [(count,)]
    return rows


def test_messy_events_route_to_auto_created_tables_and_every_event_is_accounted_for(routed, paths, instance):
    lake = Lakehouse(routed, paths)
    drop_landing_files(lake, *MESSY_FILES)

    report = run_pipeline_until_idle(instance, log=lambda _: None)

    assert report.failed == []
    rows = assert_every_messy_event_is_accounted_for(lake)
    reasons = {row["source_line"]: row["reason"] for row in table_rows(lake, ROUTER_DEAD_LETTERS)}
    assert "a field it points to is missing" in reasons[6] and "not namespace.table" in reasons[8]
    assert reasons[11] == "not a JSON object"

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
    # Each routed table has its own commits and checks in Dagster.
    for identifier in MESSY_TABLES:
        key = names.table_key(identifier)
        assert instance.get_latest_materialization_event(key) is not None
        check = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(key, names.ROW_COUNT_CHECK))
        assert check.status.value == "SUCCEEDED", identifier
    change = lake.table("shop.customers").current_snapshot().summary.additional_properties
    assert json.loads(change[summary_keys.SCHEMA_CHANGE]) == {"address.zip": "string", "vip": "boolean"}


@pytest.mark.parametrize(
    "crash_at",
    [
        faults.ROUTER_DURING_PUBLISH,
        faults.ROUTER_AFTER_DEAD_LETTERS,
        # In the routed tables' committer: their batches staged together, then each table's commit.
        faults.WRITER_AFTER_STAGING,
        faults.COMMITTER_AFTER_COMMIT,
    ],
)
def test_a_router_killed_mid_batch_routes_every_event_once_on_restart(routed, paths, crash_at):
    lake = Lakehouse(routed, paths)
    drop_landing_files(lake, *MESSY_FILES)

    # Killed cold (with a JVM of its own) at the committer's point: it commits the routed tables two
    # at a time on threads, and attached to the worker's JVM the other thread's commit would go on
    # there after the kill. The family's first point is killed cold too. Restarts run warm.
    cold_kill = crash_at in (faults.ROUTER_DURING_PUBLISH, faults.COMMITTER_AFTER_COMMIT)
    crashed = run_pipeline({faults.CRASH_ENV: crash_at}, cold=cold_kill)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    restarted = run_pipeline()

    assert restarted.returncode == 0, restarted.stdout[-2000:] + restarted.stderr[-2000:]
    assert_every_messy_event_is_accounted_for(Lakehouse.from_env())


CHANGES = {
    "name": "cdc",
    "table_identifier": "crm.${/table}",
    "operation": "${/op}",
    "identifier_columns": ["id"],
    "commit_interval": "0s",
    "flush": {"max_bytes": 1},
    "maintenance": {"landing_retention": "0s"},
}


def test_routed_changes_apply_in_order_and_a_missing_table_is_a_dead_letter(lakehouse_home, tmp_path, monkeypatch):
    write_config(tmp_path, {"streams": [CHANGES]}, monkeypatch)
    lake = Lakehouse.from_env()
    spark = lakehouse_session(lake)
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.crm")
    spark.sql("CREATE TABLE lake.crm.accounts (id bigint NOT NULL, name string) USING iceberg")
    stream = lake.stream("cdc")
    change = lambda op, key, **row: json.dumps({"table": "accounts", "op": op, "id": key, **row})  # noqa: E731
    land_events(lake.paths, stream, [change("c", 1, name="a"), change("c", 2, name="b"), change("u", 1, name="a2")])
    land_events(lake.paths, stream, [json.dumps({"table": "missing", "op": "c", "id": 9})])
    land_events(lake.paths, stream, [change("d", 2), change("u", 1, name="a3"), change("c", 3, name="c")])

    with dg.DagsterInstance.get() as instance:
        assert run_pipeline_until_idle(instance, log=lambda _: None).failed == []

    assert sorted((row["id"], row["name"]) for row in table_rows(lake, "crm.accounts")) == [
        (1, "a3"),
        (3, "c"),
    ]
    [dead_letter] = table_rows(lake, "lakehouse.cdc_dead_letters")
    assert (
        dead_letter["reason"]
        == "table_identifier crm.${/table}: table crm.missing does not exist and auto_create is false"
    )
    assert lake.table("crm.missing") is None
    # Routed, past landing_retention: the files and the ledger entries go, but for the highest, which
    # the next batch continues after.
    assert list_landing_files(landing_dir(lake.paths, stream)) == []
    assert [record.sequence for record in lake.ledger("cdc").batches()] == [3]

    # After the missing table is created, a replay routes the dead letter there and removes it.
    spark.sql("CREATE TABLE lake.crm.missing (id bigint NOT NULL, name string) USING iceberg")
    replayed = replay_dead_letters(lake, "lakehouse.cdc_dead_letters")
    assert replayed.landed == {"cdc": 1}
    with dg.DagsterInstance.get() as instance:
        assert run_pipeline_until_idle(instance, log=lambda _: None).failed == []
    assert [row["id"] for row in table_rows(lake, "crm.missing")] == [9]
    assert table_rows(lake, "lakehouse.cdc_dead_letters") == []
    assert [record.sequence for record in lake.ledger("cdc").batches()] == [4]


def test_a_table_found_after_the_code_location_loaded_is_committed_and_checked_by_the_router_run(
    routed, paths, instance
):
    lake = Lakehouse(routed, paths)
    definitions = build_definitions(routed)  # loaded before any event was routed: no committer for shop.orders
    stream = routed.stream("app_events")
    land_events(paths, stream, [json.dumps({"source": {"db": "shop", "table": "orders"}, "order_id": 1})])
    batch, _ = mint_next_batch(lake, stream, drain=True)

    result = run_job(
        definitions.resolve_job_def("app_events_stage_job"), instance, writer_run_request(batch).run_config
    )

    assert result.success
    assert [row["order_id"] for row in table_rows(lake, "shop.orders")] == [1]
    key = names.table_key("shop.orders")
    materialization = instance.get_latest_materialization_event(key).asset_materialization
    assert materialization.metadata["rows"].value == 1
    assert materialization.metadata[names.ROW_COUNT_METADATA].value == 1  # the standard table metadata
    # Reported as every commit is: the blocking checks evaluated on the snapshot it committed.
    for check in names.CHECK_NAMES:
        evaluation = latest_evaluation(instance, dg.AssetCheckKey(key, check))
        assert evaluation is not None and evaluation.passed, check
        assert evaluation.metadata["snapshot_id"] == materialization.metadata["snapshot_id"], check


TENANTS = {
    "name": "tenants",
    "table_identifier": "t.${/tenant}",
    "auto_create": True,
    "commit_interval": "0s",
    "flush": {"max_bytes": 1},
}


@pytest.fixture
def tenants(lakehouse_home, tmp_path, monkeypatch):
    """One stream routing each event to the table of its tenant."""
    write_config(tmp_path, {"streams": [TENANTS]}, monkeypatch)


def land_tenant_events(paths, first: int, count: int, tables: int) -> list[str]:
    """Land events ``first`` .. ``first + count - 1`` spread over ``tables`` tenants; returns them."""
    events = [
        json.dumps({"tenant": f"tenant_{i % tables:02d}", "id": i, "amount": i / 4})
        for i in range(first, first + count)
    ]
    land_events(paths, load_config().stream("tenants"), events)
    return events


def assert_tenant_tables_hold(lake, events: list[str]) -> None:
    """DuckDB finds in each tenant's table exactly the ids landed for it, once each (the oracle)."""
    expected: dict[str, list[int]] = {}
    for line in events:
        event = json.loads(line)
        expected.setdefault(f"t.{event['tenant']}", []).append(event["id"])
    for identifier, ids in expected.items():
        assert [row[0] for row in _duckdb_rows(lake, identifier, "id")] == sorted(ids), identifier


DATABASE_TABLES = 12
"""Tables of the routed database: more than a run's two-at-a-time commits, so that the number of
runs visibly does not follow it (``bench/many_tables.py`` measures 500)."""


def test_a_database_of_tables_commits_every_event_once_in_runs_independent_of_the_table_count(tenants, paths, instance):
    first_round = land_tenant_events(paths, 0, 30 * DATABASE_TABLES, tables=DATABASE_TABLES)

    report = run_pipeline_until_idle(instance, log=lambda _: None)

    # The router routes (the tables are new), then one committer run stages and commits them all.
    assert report.failed == [] and len(report.succeeded) == 2, report.succeeded
    assert_tenant_tables_hold(Lakehouse.from_env(), first_round)

    second_round = land_tenant_events(paths, 30 * DATABASE_TABLES, 20 * DATABASE_TABLES, tables=DATABASE_TABLES)
    report = run_pipeline_until_idle(instance, log=lambda _: None)

    # Now every table is in the definitions: the router's run routes, stages and commits them all.
    assert report.failed == [] and [label.split()[0] for label in report.succeeded] == ["tenants_stage_job"]
    lake = Lakehouse.from_env()
    assert_tenant_tables_hold(lake, first_round + second_round)
    for index in range(DATABASE_TABLES):
        key = names.table_key(f"t.tenant_{index:02d}")
        materialization = instance.get_latest_materialization_event(key).asset_materialization
        assert materialization.metadata["rows"].value == 20
        for check in names.CHECK_NAMES:
            record = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(key, check))
            assert record.status.value == "SUCCEEDED", (key, check)
            checked = record.event.dagster_event.event_specific_data.metadata["snapshot_id"].value
            assert checked == materialization.metadata["snapshot_id"].value

    # `lakehouse check` runs the blocking checks of every routed table in one run per router.
    checked = run_lakehouse(["check"])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("rows_reconcile_with_batches: passed") == DATABASE_TABLES


def test_a_routed_table_that_cannot_commit_is_reported_on_it_and_the_others_commit(tenants, paths, instance):
    first_round = land_tenant_events(paths, 0, 30, tables=3)
    assert run_pipeline_until_idle(instance, log=lambda _: None).failed == []
    # An operator mistake: a batch of tenant_01's ledger moved ahead, leaving a gap before it.
    ledger = paths.staging(routed_stream_name("tenants", "t.tenant_01"))
    [committed] = sorted(ledger.iterdir())
    ahead = ledger / f"{int(committed.name) + 2:0{len(committed.name)}d}"
    ahead.mkdir()
    minted = json.loads((committed / "batch.json").read_text())
    (ahead / "batch.json").write_text(json.dumps({**minted, "sequence": minted["sequence"] + 2}))

    second_round = land_tenant_events(paths, 30, 30, tables=3)
    report = run_pipeline_until_idle(instance, log=lambda _: None)

    # The writer run fails naming tenant_01 (and so does the committer run the sensor requests for it).
    assert {label.split()[0] for label in report.failed} <= {"tenants_stage_job", "tenants_routed_commit_job"}
    assert report.failed[0].startswith("tenants_stage_job")
    lake = Lakehouse.from_env()
    assert_tenant_tables_hold(lake, [e for e in first_round + second_round if "tenant_01" not in e])
    assert_tenant_tables_hold(lake, [e for e in first_round if "tenant_01" in e])
    gap = instance.get_latest_asset_check_evaluation_record(
        dg.AssetCheckKey(names.table_key("t.tenant_01"), names.SEQUENCE_CHECK)
    )
    assert gap.status.value == "FAILED"
    assert "batch 2 is missing" in gap.event.dagster_event.event_specific_data.metadata["found"].value
    for healthy in ("t.tenant_00", "t.tenant_02"):
        check = dg.AssetCheckKey(names.table_key(healthy), names.ROW_COUNT_CHECK)
        assert instance.get_latest_asset_check_evaluation_record(check).status.value == "SUCCEEDED"


@pytest.fixture(scope="module")
def tenants_first_round(tmp_path_factory, dagster_home_template) -> tuple[Path, list[str]]:
    """The tenants stream's first round, 60 events over six new tables, committed once in
    ``base/work`` by a run in this process (as each test below committed it for itself) and kept
    as a template in ``base``, which ``restored_home`` restores into that same directory (Iceberg's
    metadata holds absolute paths); its events."""
    base = tmp_path_factory.mktemp("tenants-first-round")
    work = base / "work"
    shutil.copytree(dagster_home_template, work / "dagster")
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_home(work, monkeypatch)
        write_config(work, {"streams": [TENANTS]}, monkeypatch)
        # No schema evolution: the tables' batches are staged together by one Spark job.
        first_round = land_tenant_events(LakehousePaths.from_env(), 0, 60, tables=6)
        with dg.DagsterInstance.get() as instance:
            assert run_pipeline_until_idle(instance, log=lambda _: None).failed == []
    shutil.copytree(work, base / FIRST_ROUND_TEMPLATE)
    return base, first_round


@pytest.fixture
def tenants_after_a_round(tenants_first_round, monkeypatch) -> list[str]:
    """A fresh copy of the tenants' committed first round in use (``tenants_first_round``); its events."""
    base, first_round = tenants_first_round
    restored_home(base, monkeypatch)
    return first_round


@pytest.mark.parametrize("crash_at", [faults.WRITER_AFTER_STAGING, faults.COMMITTER_AFTER_COMMIT])
def test_the_routed_tables_committer_killed_mid_cycle_commits_every_event_once_on_restart(
    tenants_after_a_round, crash_at
):
    # The first round's six tables committed (a fresh copy of one committed once for both points).
    first_round = tenants_after_a_round
    paths = LakehousePaths.from_env()
    second_round = land_tenant_events(paths, 60, 60, tables=6)

    # Cold, as above: the routed tables are committed two at a time on threads.
    crashed = run_pipeline({faults.CRASH_ENV: crash_at}, cold=True)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    if crash_at == faults.WRITER_AFTER_STAGING:
        # Killed inside the grouped staging: every table's batch has its attempt, none is recorded.
        for index in range(6):
            latest = StreamLedger(paths.staging(routed_stream_name("tenants", f"t.tenant_{index:02d}"))).latest()
            assert latest.staged is None and list(latest.directory.glob(f"attempt-*/{EVENTS_DIR}"))
    restarted = run_pipeline()

    assert restarted.returncode == 0, restarted.stdout[-2000:] + restarted.stderr[-2000:]
    assert_tenant_tables_hold(Lakehouse.from_env(), first_round + second_round)
