"""``lakehouse demo``: land sample orders, run until idle, and read the result back with DuckDB."""

from __future__ import annotations

import json
import os
import random
from datetime import datetime, timedelta, timezone

from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.cli.status import lakehouse_status
from lakehouse_assets.commit.dead_letters import dead_letter_identifier
from lakehouse_assets.config.loader import CONFIG_ENV
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.engine.spark import start_jvm_in_background
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.ops.sql import connect, run_query, view_names, write_result
from lakehouse_assets.quality.duck import iceberg_connection, read_storage_of, scan, single_count
from lakehouse_assets.runner import dagster_instance, run_until_idle

DEMO_SEED = 7


def sample_orders(count: int, first_order_id: int = 1, seed: int = DEMO_SEED) -> list[str]:
    """NDJSON order events over the last three days, plus one event that breaks the schema."""
    rng = random.Random(seed)
    start = datetime.now(timezone.utc) - timedelta(days=3)
    lines = [
        json.dumps(
            {
                "order_id": first_order_id + index,
                "customer_id": rng.randint(1, 500),
                "amount": round(rng.uniform(5, 500), 2),
                "ts": (start + timedelta(seconds=rng.randint(0, 3 * 86400))).isoformat(),
            }
        )
        for index in range(count)
    ]
    lines.append(json.dumps({"customer_id": 1, "amount": "n/a", "note": "no order_id: a dead letter"}))
    return lines


def _committed_rows(lake: Lakehouse, table_identifier: str) -> int:
    """Rows the table's current snapshot holds (0 when it does not exist yet)."""
    table = lake.table(table_identifier)
    snapshot = table.current_snapshot() if table else None
    summary = snapshot.summary.additional_properties if snapshot and snapshot.summary else {}
    return int(summary.get("total-records", "0"))


def run_demo(events: int) -> int:
    """Land ``events`` sample orders in the first stream, run until idle, print a summary."""
    lake = Lakehouse.from_env()
    stream = lake.config.streams[0]
    earlier = _committed_rows(lake, stream.table_identifier)
    if earlier:
        print(
            f"{stream.table_identifier} already holds {earlier} rows from an earlier demo; adding {events} more "
            f"(order ids from {earlier + 1}). `make clean` starts over."
        )
    landed = land_events(lake.paths, stream, sample_orders(events, first_order_id=earlier + 1), origin="demo")
    print(f"landed {events + 1} events in {landed[0].parent}")
    start_jvm_in_background(lake.config)  # it starts while Dagster loads its instance and definitions
    with dagster_instance(lake.paths) as instance:
        report = run_until_idle(build_definitions(lake.config), instance)
        status = lakehouse_status(lake, instance)
    read_storage_of(lake.config.catalog)
    connection = iceberg_connection()
    for entry in status:
        location = lake.metadata_location(entry["table"])
        if location and entry["snapshot_id"]:
            count = single_count(connection, f"SELECT count(*) FROM {scan(location, entry['snapshot_id'])}")
            print(f"DuckDB reads {count} rows from {entry['table']} at snapshot {entry['snapshot_id']}")
        for check, result in entry["last_checks"].items():
            print(f"  check {check}: {result}")
    print(f"{len(report.succeeded)} runs succeeded, {len(report.failed)} failed")
    dead_letters = dead_letter_identifier(stream.table_identifier)
    query = f"SELECT reason, source_file, source_line, event FROM {dead_letters} ORDER BY recorded_at DESC LIMIT 1"
    print(f'\nThe broken event and its reason: lakehouse sql "{query}"')
    connection = connect(lake)
    write_result(run_query(connection, query, view_names(connection)), "table")
    settings = [f"{name}={os.environ[name]}" for name in ("DAGSTER_HOME", CONFIG_ENV) if os.environ.get(name)]
    print(f"Open the Dagster UI on the same instance: make ui ({' '.join(settings)} dagster dev -w workspace.yaml)")
    return 1 if report.failed else 0
