"""Event-time completeness through the real pipeline: watermarks, complete days, late events."""

import pytest

from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.config.loader import load_config
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.runner import run_until_idle
from lakehouse_assets_tests.conftest import ORDERS_STREAM, order_event, write_config

pytestmark = pytest.mark.spark


@pytest.fixture
def tracked(lakehouse_home, tmp_path, monkeypatch):
    completeness = {"allowed_lateness": "1h", "start_date": "2026-11-01"}
    write_config(tmp_path, {"streams": [{**ORDERS_STREAM, "completeness": completeness}]}, monkeypatch)
    return load_config()


def _commit(lake, instance, times):
    land_events(lake.paths, lake.stream("orders"), [order_event(i, ts=ts) for i, ts in enumerate(times)])
    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []
    summary = lake.table("sales.orders").current_snapshot().summary.additional_properties
    return summary[summary_keys.WATERMARK], int(summary[summary_keys.LATE_EVENTS])


def test_days_complete_as_the_watermark_passes_and_late_events_are_counted(tracked, paths, instance):
    lake = Lakehouse(tracked, paths)
    complete_days = names.complete_days_key("sales.orders")

    first = _commit(lake, instance, ["2026-11-01T12:00:00Z", "2026-11-02T12:00:00Z", "2026-11-03T12:00:00Z"])

    assert first == ("2026-11-03T11:00:00.000000+00:00", 0)
    assert instance.get_materialized_partitions(complete_days) == {"2026-11-01", "2026-11-02"}

    late_and_new = ["2026-11-01T09:00:00Z", "2026-11-02T23:00:00Z", "2026-11-03T10:00:00Z", "2026-11-04T06:00:00Z"]
    assert _commit(lake, instance, late_and_new) == ("2026-11-04T05:00:00.000000+00:00", 2)
    assert instance.get_materialized_partitions(complete_days) == {"2026-11-01", "2026-11-02", "2026-11-03"}
    materialization = instance.get_latest_materialization_event(names.table_key("sales.orders")).asset_materialization
    assert materialization.metadata["late_events"].value == 2

    # Only late events: the watermark never moves back and no day is reported again.
    assert _commit(lake, instance, ["2026-11-02T08:00:00Z"]) == ("2026-11-04T05:00:00.000000+00:00", 1)
    assert instance.get_materialized_partitions(complete_days) == {"2026-11-01", "2026-11-02", "2026-11-03"}
