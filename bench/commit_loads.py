"""How often one table's commit reads the table, and how long it takes, on the embedded Hadoop
catalog and on a JDBC catalog on PostgreSQL.

One process, one warm Spark driver (local[2]). For each catalog, an append stream and a change
stream (``catalog_commits.STREAMS``) get ``--rounds`` rounds of new events; each round stages one
batch of each and then times ``commit_table`` of each table alone, counting what it asks of the
catalog: table loads (``Lakehouse.table``: a metadata-location lookup and, unless that version was
read before in this process, a metadata file parsed) and metadata files parsed. The first round
(table creation, JIT warm-up) is left out.

    python bench/commit_loads.py [--rounds 10] [--orders 2000] [--changes 500]

Run it on two checkouts to compare them. Needs PostgreSQL's server programs and JDBC driver.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from catalog_commits import STREAMS, _use  # noqa: E402 - the same pipeline as the catalog benchmark

TABLES = {stream["name"]: stream["table_identifier"] for stream in STREAMS}


def _counted(counts: Counter, name: str, function: Any) -> Any:
    def counting(*args: Any, **kwargs: Any) -> Any:
        counts[name] += 1
        return function(*args, **kwargs)

    return counting


def _rounds(rounds: int, orders: int, changes: int) -> dict[str, dict[str, list[float]]]:
    from pyiceberg.table import StaticTable

    from lakehouse_assets.batches.landing import land_events
    from lakehouse_assets.catalog import table_metadata
    from lakehouse_assets.engine.spark import lakehouse_session
    from lakehouse_assets.ingest.micro_batching import mint_next_batch
    from lakehouse_assets.ingest.staging import stage_batch
    from lakehouse_assets.ingest.table_commits import commit_table
    from lakehouse_assets.lakehouse import Lakehouse

    lake = Lakehouse.from_env()
    spark = lakehouse_session(lake)
    counts: Counter = Counter()
    table_metadata.load_committed_table = _counted(counts, "loads", table_metadata.load_committed_table)
    StaticTable.from_metadata = _counted(counts, "metadata files parsed", StaticTable.from_metadata)  # type: ignore[method-assign]
    figures: dict[str, dict[str, list[float]]] = {table: {} for table in TABLES.values()}
    for number in range(rounds):
        first = number * orders
        land_events(
            lake.paths,
            lake.stream("orders"),
            [json.dumps({"order_id": first + i, "amount": i / 2}) for i in range(orders)],
        )
        land_events(
            lake.paths,
            lake.stream("customers"),
            [json.dumps({"op": "u" if i % 3 else "c", "id": i, "name": f"n{number}-{i}"}) for i in range(changes)],
        )
        for stream_name, table in TABLES.items():
            stream = lake.stream(stream_name)
            batch, _ = mint_next_batch(lake, stream, drain=True)
            assert batch is not None
            stage_batch(spark, lake, stream, batch.sequence)
            counts.clear()
            started = time.monotonic()
            outcome = commit_table(spark, lake, table, f"bench-{number}")
            seconds = time.monotonic() - started
            assert [result.last_sequence for result in outcome.results] == [batch.sequence], outcome
            if number == 0:
                continue
            for name, value in [("commit seconds", seconds), *counts.items()]:
                figures[table].setdefault(name, []).append(value)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--orders", type=int, default=2000)
    parser.add_argument("--changes", type=int, default=500)
    args = parser.parse_args()

    import pyspark

    from lakehouse_assets_tests.postgres_server import SERVER_USER, jdbc_driver_jar, postgres_server

    base = Path(tempfile.mkdtemp(prefix="lakehouse-commit-loads-"))
    jar = jdbc_driver_jar()
    results = {}
    with postgres_server() as server:
        uri = server.create_database("iceberg")
        _use(base / "hadoop", {"type": "hadoop", "warehouse": str(base / "hadoop" / "warehouse")}, jar)
        results["hadoop"] = _rounds(args.rounds, args.orders, args.changes)
        _use(base / "jdbc", {"type": "jdbc", "uri": uri, "jdbc.user": SERVER_USER}, jar)
        results["jdbc"] = _rounds(args.rounds, args.orders, args.changes)

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; Spark {pyspark.__version__} local[2]; "
        f"{args.orders} appends and {args.changes} changes per round, {args.rounds - 1} rounds measured"
    )
    print("catalog | table | commit s: median | p90 | table loads per commit | metadata files parsed per commit")
    for catalog, tables in results.items():
        for table, figures in tables.items():
            seconds = sorted(figures["commit seconds"])
            p90 = seconds[min(len(seconds) - 1, round(0.9 * (len(seconds) - 1)))]
            loads = statistics.median(figures.get("loads", [0]))
            parsed = statistics.median(figures.get("metadata files parsed", [0]))
            median = statistics.median(seconds)
            print(f"{catalog:7} | {table:14} | {median:6.3f} | {p90:6.3f} | {loads:5.0f} | {parsed:5.0f}")


if __name__ == "__main__":
    main()
