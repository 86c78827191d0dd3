"""Dead-letter replay through the real pipeline: after a fix every replayed event leaves the
dead-letter table exactly when it lands in the table, or returns with its new reason, once."""

import json
import signal

import pytest

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.config.loader import load_config
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.ops.replay import replay_dead_letters
from lakehouse_assets.runner import run_until_idle
from lakehouse_assets_tests.conftest import fail_python_workers, write_config
from lakehouse_assets_tests.fault_injection.pipeline import run_lakehouse

pytestmark = pytest.mark.spark


def _orders(amount_required: bool) -> dict:
    columns = [
        {"name": "order_id", "type": "long", "required": True},
        {"name": "amount", "type": "double", "required": amount_required},
    ]
    return {
        "streams": [
            {
                "name": "orders",
                "table_identifier": "sales.orders",
                "auto_create": True,
                "schema": {"columns": columns},
                "commit_interval": "0s",
            }
        ]
    }


def _rows(lake, identifier, *columns):
    table = lake.table(identifier)
    return sorted(tuple(row.values()) for row in table.scan(selected_fields=columns).to_arrow().to_pylist())


def _run(config, instance):
    assert run_until_idle(build_definitions(config), instance, log=lambda _: None).failed == []


def _reject_then_fix(paths, tmp_path, monkeypatch, instance):
    """Commit four events, three of them dead letters, then make ``amount`` optional."""
    write_config(tmp_path, _orders(amount_required=True), monkeypatch)
    lake = Lakehouse.from_env()
    events = [{"order_id": 1, "amount": 1.5}, {"order_id": 2, "amount": "n/a"}, {"order_id": 3}, {"amount": 2.0}]
    land_events(paths, lake.stream("orders"), [json.dumps(event) for event in events])
    _run(lake.config, instance)
    assert [reason for (reason,) in _rows(lake, "sales.orders_dead_letters", "reason")] == [
        "missing required field 'amount'",
        "missing required field 'order_id'",
        "required field 'amount': n/a is not a double",
    ]

    # The fix: amount becomes optional, in the table and in the config.
    lakehouse_session(lake).sql("ALTER TABLE lake.sales.orders ALTER COLUMN amount DROP NOT NULL")
    write_config(tmp_path, _orders(amount_required=False), monkeypatch)
    return load_config()


def test_replayed_dead_letters_land_once_or_return_with_their_new_reason(paths, tmp_path, monkeypatch, instance):
    lake = Lakehouse(_reject_then_fix(paths, tmp_path, monkeypatch, instance), paths)
    fail_python_workers(lakehouse_session(lake), monkeypatch, tmp_path / "no-python")
    first = replay_dead_letters(lake, "sales.orders", reason="amount")
    again = replay_dead_letters(lake, "sales.orders", reason="amount")
    assert (first.landed, again.landed, again.already_pending) == ({"orders": 2}, {}, 2)
    _run(lake.config, instance)

    assert _rows(lake, "sales.orders", "order_id", "amount") == [(1, 1.5), (2, None), (3, None)]
    assert _rows(lake, "sales.orders_dead_letters", "reason") == [("missing required field 'order_id'",)]

    # An event that still fails comes back once, with the reason it failed for now.
    assert replay_dead_letters(lake, "sales.orders").landed == {"orders": 1}
    _run(lake.config, instance)
    [(event, reason, source_file)] = _rows(lake, "sales.orders_dead_letters", "event", "reason", "source_file")
    assert (json.loads(event), reason) == ({"amount": 2.0}, "missing required field 'order_id'")
    assert _rows(lake, "sales.orders", "order_id") == [(1,), (2,), (3,)]


def test_a_replay_killed_between_its_dead_letter_and_table_commits_places_every_event_once(
    paths, tmp_path, monkeypatch, instance
):
    lake = Lakehouse(_reject_then_fix(paths, tmp_path, monkeypatch, instance), paths)
    replay_dead_letters(lake, "sales.orders", reason="amount")

    crashed = run_lakehouse(["run", "--until-idle"], {faults.CRASH_ENV: faults.COMMITTER_AFTER_DEAD_LETTERS})

    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    # The replayed rows left the dead-letter table; the table commit of their batch is pending.
    assert _rows(lake, "sales.orders_dead_letters", "reason") == [("missing required field 'order_id'",)]
    assert _rows(lake, "sales.orders", "order_id") == [(1,)]
    restarted = run_lakehouse(["run", "--until-idle"])
    assert restarted.returncode == 0, restarted.stdout[-2000:] + restarted.stderr[-2000:]
    assert _rows(lake, "sales.orders", "order_id", "amount") == [(1, 1.5), (2, None), (3, None)]
    assert _rows(lake, "sales.orders_dead_letters", "reason") == [("missing required field 'order_id'",)]
