"""Write-audit-publish (``publish: audit``) through real Dagster runs: a batch that breaks a check
never reaches main; after a fix it is published exactly once, or discarded and staged again."""

import json

import dagster as dg
import pytest

from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.cli import main as cli
from lakehouse_assets.cli.status import lakehouse_status
from lakehouse_assets.commit.branches import audit_state
from lakehouse_assets.config.loader import load_config
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.quality.duck import iceberg_connection, scan
from lakehouse_assets.runner import run_until_idle
from lakehouse_assets_tests.conftest import write_config

pytestmark = pytest.mark.spark

NOT_NEGATIVE = {"name": "amount_not_negative", "condition": "amount >= 0"}


def _audited_orders(expectation: dict) -> dict:
    return {
        "streams": [
            {
                "name": "orders",
                "table_identifier": "sales.orders",
                "auto_create": True,
                "publish": "audit",
                "schema": {
                    "columns": [
                        {"name": "order_id", "type": "long", "required": True},
                        {"name": "amount", "type": "double"},
                    ]
                },
                "expectations": [expectation],
                "commit_interval": "0s",
            }
        ]
    }


def _land(lake, *events):
    land_events(lake.paths, lake.stream("orders"), [json.dumps(event) for event in events])


def _run(config, instance):
    return run_until_idle(build_definitions(config), instance, log=lambda _: None)


def _main_rows(lake, identifier="sales.orders", columns="order_id, amount"):
    """What a reader of main sees, read by DuckDB from the table's current metadata."""
    table = lake.table(identifier)
    if table is None or table.current_snapshot() is None:
        return []
    location = lake.metadata_location(identifier)
    query = f"SELECT {columns} FROM {scan(location, table.current_snapshot().snapshot_id)} ORDER BY ALL"
    return iceberg_connection().sql(query).fetchall()


def _main_history(lake):
    """Every snapshot main has ever pointed to (Iceberg's snapshot log)."""
    return [entry.snapshot_id for entry in lake.table("sales.orders").metadata.snapshot_log]


def _check(instance, name):
    key = dg.AssetCheckKey(names.table_key("sales.orders"), name)
    return instance.get_latest_asset_check_evaluation_record(key).evaluation


def _commit_a_negative_amount(lake, instance):
    """Batch 1 publishes; batch 2 (order 3 has a negative amount) fails the expectation on the audit branch."""
    _land(lake, {"order_id": 1, "amount": 5.0}, {"order_id": 2, "amount": 7.0}, {"amount": 1.0})
    assert _run(lake.config, instance).failed == []
    assert _main_rows(lake) == [(1, 5.0), (2, 7.0)]

    _land(lake, {"order_id": 3, "amount": -4.0}, {"order_id": 4, "amount": 1.0})
    assert len(_run(lake.config, instance).failed) == 1
    audited = audit_state(lake.table("sales.orders"))
    assert audited.unpublished_ranges() == {"orders": [2, 2]}
    return audited.audit


def test_a_batch_that_breaks_a_check_is_never_on_main_and_publishes_once_after_the_fix(
    tmp_path, monkeypatch, instance, capsys
):
    write_config(tmp_path, _audited_orders(NOT_NEGATIVE), monkeypatch)
    lake = Lakehouse.from_env()
    failed_snapshot = _commit_a_negative_amount(lake, instance)

    # Main is where it was, and the UI shows what the check found on the audited snapshot.
    assert _main_rows(lake) == [(1, 5.0), (2, 7.0)]
    evaluation = _check(instance, names.EXPECTATIONS_CHECK)
    assert not evaluation.passed
    assert evaluation.metadata["snapshot_id"].value == str(failed_snapshot)
    assert evaluation.metadata["rows_not_meeting"].value == {"amount_not_negative": 1}
    assert "1 rows do not meet amount_not_negative" in evaluation.metadata["found"].value
    [status] = lakehouse_status(lake, instance)
    assert (status["unpublished_batches"], status["last_checks"]["expectations_met"]) == ({"orders": [2, 2]}, "FAILED")

    # Later batches stay staged, in order; main and the audit branch do not move.
    _land(lake, {"order_id": 5, "amount": 2.0})
    assert _run(lake.config, instance).failed == []
    table = lake.table("sales.orders")
    assert audit_state(table).audit == failed_snapshot
    assert failed_snapshot not in _main_history(lake)
    assert _main_rows(lake) == [(1, 5.0), (2, 7.0)]

    # Materializing the published asset on its own does not get round the failed check.
    published_alone = dg.materialize(
        [build_definitions(lake.config).resolve_assets_def(names.published_key("sales.orders"))],
        instance=instance,
        raise_on_error=False,
    )
    assert not published_alone.success
    assert _main_rows(lake) == [(1, 5.0), (2, 7.0)]

    # The fix: refunds are allowed. The checks run again on the audited snapshot, which is published.
    write_config(tmp_path, _audited_orders({**NOT_NEGATIVE, "condition": "amount >= -10"}), monkeypatch)
    assert cli.main(["audit", "publish", "--table", "sales.orders"]) == 0
    assert "main now at snapshot" in capsys.readouterr().out
    assert _main_history(lake)[-1] == failed_snapshot
    lake = Lakehouse.from_env()
    assert _run(lake.config, instance).failed == []

    assert _main_rows(lake) == [(1, 5.0), (2, 7.0), (3, -4.0), (4, 1.0), (5, 2.0)]
    assert _main_rows(lake, "sales.orders_dead_letters", "reason") == [("missing required field 'order_id'",)]
    table = lake.table("sales.orders")
    assert audit_state(table).audit == table.current_snapshot().snapshot_id
    assert _check(instance, names.SEQUENCE_CHECK).passed


def test_discarded_batches_are_staged_again_with_the_fix_and_nothing_is_lost(tmp_path, monkeypatch, instance):
    write_config(tmp_path, _audited_orders(NOT_NEGATIVE), monkeypatch)
    lake = Lakehouse.from_env()
    failed_snapshot = _commit_a_negative_amount(lake, instance)

    assert cli.main(["audit", "discard", "--table", "sales.orders"]) == 0
    assert audit_state(lake.table("sales.orders")).awaiting_publish is False
    # The fix: events with a negative amount are dead letters instead of blocking the table.
    write_config(tmp_path, _audited_orders({**NOT_NEGATIVE, "on_failure": "dead_letter"}), monkeypatch)
    lake = Lakehouse.from_env()
    assert _run(lake.config, instance).failed == []

    assert _main_rows(lake) == [(1, 5.0), (2, 7.0), (4, 1.0)]
    assert _main_rows(lake, "sales.orders_dead_letters", "reason, event") == [
        ("expectation amount_not_negative not met: amount >= 0", '{"order_id": 3, "amount": -4.0}'),
        ("missing required field 'order_id'", '{"amount": 1.0}'),
    ]
    assert failed_snapshot not in _main_history(lake)


def test_maintenance_waits_while_a_commit_awaits_publishing_and_the_audit_branch_follows_it(
    paths, tmp_path, monkeypatch, instance
):
    aggressive = {
        "schedule": None,
        "compaction": {"min_input_files": 2},
        "expire_snapshots": {"older_than": "0s", "retain_last": 2},
    }

    def configure(condition):
        document = _audited_orders({**NOT_NEGATIVE, "condition": condition})
        document["streams"][0]["maintenance"] = aggressive
        write_config(tmp_path, document, monkeypatch)
        return load_config()

    lake = Lakehouse(configure("amount >= 0"), paths)
    _commit_a_negative_amount(lake, instance)
    main_before = lake.table("sales.orders").current_snapshot().snapshot_id

    # Compaction would move main away from the audit branch: it waits.
    assert cli.main(["maintain", "--table", "sales.orders"]) == 0
    table = lake.table("sales.orders")
    assert table.current_snapshot().snapshot_id == main_before
    assert audit_state(table).awaiting_publish

    lake = Lakehouse(configure("amount >= -10"), paths)
    assert cli.main(["audit", "publish", "--table", "sales.orders"]) == 0
    assert cli.main(["maintain", "--table", "sales.orders"]) == 0
    table = lake.table("sales.orders")
    assert table.current_snapshot().summary.operation.value == "replace"  # compacted on main
    assert audit_state(table).audit == table.current_snapshot().snapshot_id  # and the audit branch followed

    _land(lake, {"order_id": 5, "amount": 2.0})
    assert _run(lake.config, instance).failed == []
    assert _main_rows(lake) == [(1, 5.0), (2, 7.0), (3, -4.0), (4, 1.0), (5, 2.0)]
    assert all(_check(instance, name).passed for name in (names.SEQUENCE_CHECK, names.ROW_COUNT_CHECK))
