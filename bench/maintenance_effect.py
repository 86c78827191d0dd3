"""What maintenance buys: query latency after many CDC batches, and commit latency as snapshots pile up.

Part 1, queries: a change stream commits one batch of inserts, then N batches of changes (updates
and deletes of random keys) through the real writer and committer; DuckDB runs a count and a
filtered query on the table (median of 5) before and after one maintenance pass (compaction with
deletes applied, manifest rewrite, expiry).

Part 2, commits: an append stream commits M small batches in two homes side by side, one never
maintained, one maintained every 20 commits (expire all but the last 5 snapshots); the mean commit
latency of the first and last 10 commits and the final snapshot count and metadata size per home.

    python bench/maintenance_effect.py [--change-batches 30] [--commits 100]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import yaml

CUSTOMERS = {
    "name": "customers",
    "table_identifier": "bench.customers",
    "auto_create": True,
    "operation": "${/op}",
    "identifier_columns": ["id"],
    "schema": {
        "columns": [
            {"name": "id", "type": "long", "required": True},
            {"name": "name", "type": "string"},
            {"name": "score", "type": "double"},
        ]
    },
    "table_properties": {"format-version": "2"},
    "maintenance": {"compaction": {"min_input_files": 2}, "expire_snapshots": {"older_than": "0s", "retain_last": 1}},
}
EVENTS = {
    "name": "events",
    "table_identifier": "bench.events",
    "auto_create": True,
    "schema": {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "kind", "type": "string"}]},
    "table_properties": {"format-version": "2"},
    "maintenance": {"compaction": {"min_input_files": 2}, "expire_snapshots": {"older_than": "0s", "retain_last": 5}},
}


def _use_home(directory: Path, streams: list[dict]) -> None:
    directory.mkdir(parents=True)
    (directory / "lakehouse.yaml").write_text(yaml.safe_dump({"streams": streams}))
    os.environ["LAKEHOUSE_HOME"] = str(directory / "home")
    os.environ["LAKEHOUSE_CONFIG"] = str(directory / "lakehouse.yaml")


def _commit_events(spark, lines: list[str], stream_name: str):
    """Land, mint, stage and commit one batch through the pipeline's own functions."""
    from lakehouse_assets.batches.landing import land_events
    from lakehouse_assets.ingest.micro_batching import mint_next_batch
    from lakehouse_assets.ingest.staging import stage_batch
    from lakehouse_assets.ingest.table_commits import commit_table
    from lakehouse_assets.lakehouse import Lakehouse

    lake = Lakehouse.from_env()
    stream = lake.stream(stream_name)
    land_events(lake.paths, stream, lines)
    batch, _ = mint_next_batch(lake, stream, drain=True)
    stage_batch(spark, lake, stream, batch.sequence)
    [result] = commit_table(spark, lake, stream.table_identifier, "bench").results
    return result


def _query_seconds(identifier: str) -> dict[str, float]:
    from lakehouse_assets.lakehouse import Lakehouse
    from lakehouse_assets.quality.duck import iceberg_connection, scan

    lake = Lakehouse.from_env()
    location = lake.metadata_location(identifier)
    table = scan(location, lake.table(identifier).current_snapshot().snapshot_id)
    queries = {
        "count": f"SELECT count(*) FROM {table}",
        "filtered": f"SELECT avg(score) FROM {table} WHERE id BETWEEN 1000 AND 2000",
    }
    timings = {}
    for name, query in queries.items():
        runs = []
        for _ in range(5):
            connection = iceberg_connection()
            started = time.perf_counter()
            connection.sql(query).fetchall()
            runs.append(time.perf_counter() - started)
        timings[name] = statistics.median(runs)
    return timings


def _figures(identifier: str) -> dict:
    from lakehouse_assets.lakehouse import Lakehouse
    from lakehouse_assets.quality.table_stats import table_stats

    return table_stats(Lakehouse.from_env().table(identifier))


def _maintain(spark, identifier: str) -> float:
    from lakehouse_assets.lakehouse import Lakehouse
    from lakehouse_assets.ops.maintenance import maintain_table

    started = time.perf_counter()
    maintain_table(spark, Lakehouse.from_env(), identifier)
    return time.perf_counter() - started


def query_latency(workdir: Path, change_batches: int, rows: int, changes: int) -> None:
    from lakehouse_assets.engine.spark import lakehouse_session
    from lakehouse_assets.lakehouse import Lakehouse

    _use_home(workdir / "queries", [CUSTOMERS])
    spark = lakehouse_session(Lakehouse.from_env())
    randomness = random.Random(7)
    inserts = [json.dumps({"op": "c", "id": i, "name": f"n{i}", "score": i * 0.5}) for i in range(rows)]
    _commit_events(spark, inserts, "customers")
    for batch in range(change_batches):
        keys = randomness.sample(range(rows), changes)
        lines = [
            json.dumps({"op": "d", "id": key})
            if index % 5 == 0
            else json.dumps({"op": "u", "id": key, "name": f"b{batch}", "score": float(batch)})
            for index, key in enumerate(keys)
        ]
        _commit_events(spark, lines, "customers")
    before, files_before = _query_seconds("bench.customers"), _figures("bench.customers")
    seconds = _maintain(spark, "bench.customers")
    after, files_after = _query_seconds("bench.customers"), _figures("bench.customers")
    print(
        f"\nqueries after {change_batches} CDC batches of {changes} changes on {rows} rows (maintenance {seconds:.1f}s)"
    )
    print("state | data files | delete files | snapshots | count s | filtered s")
    for label, timing, files in (("before", before, files_before), ("after", after, files_after)):
        print(
            f"{label} | {files['table_data_files']} | {files['table_delete_files']} | {files['table_snapshots']} | "
            f"{timing['count']:.3f} | {timing['filtered']:.3f}"
        )
    ratios = {name: after[name] / before[name] for name in before}
    print(f"after/before: count {ratios['count']:.2f}, filtered {ratios['filtered']:.2f}")


def commit_latency(workdir: Path, commits: int) -> None:
    from lakehouse_assets.engine.spark import lakehouse_session
    from lakehouse_assets.lakehouse import Lakehouse

    print(f"\ncommit latency over {commits} commits of 100 rows")
    print("home | first 10 mean s | last 10 mean s | last/first | snapshots | metadata bytes | maintenance s")
    for label, maintained in (("never maintained", False), ("maintained every 20 commits", True)):
        _use_home(workdir / label.replace(" ", "-"), [EVENTS])
        spark = lakehouse_session(Lakehouse.from_env())
        latencies, maintenance = [], 0.0
        for number in range(commits):
            lines = [json.dumps({"id": number * 100 + i, "kind": "click"}) for i in range(100)]
            latencies.append(_commit_events(spark, lines, "events").commit_latency_seconds)
            if maintained and (number + 1) % 20 == 0:
                maintenance += _maintain(spark, "bench.events")
        first, last = statistics.mean(latencies[:10]), statistics.mean(latencies[-10:])
        figures = _figures("bench.events")
        print(
            f"{label} | {first:.3f} | {last:.3f} | {last / first:.2f} | {figures['table_snapshots']} | "
            f"{figures['table_metadata_bytes']} | {maintenance:.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--change-batches", type=int, default=30)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--changes", type=int, default=2_000)
    parser.add_argument("--commits", type=int, default=100)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="lakehouse-maintenance-bench-"))

    import duckdb
    import pyspark

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; Spark {pyspark.__version__} local[2], "
        f"Iceberg 1.10.2, DuckDB {duckdb.__version__}"
    )
    query_latency(workdir, args.change_batches, args.rows, args.changes)
    commit_latency(workdir, args.commits)


if __name__ == "__main__":
    main()
