"""Full-pipeline throughput against a bare Spark JSON -> Iceberg append of the same events.

Both run in this process on the same warm Spark session, so the ratio isolates what the pipeline
adds (landing, staging Parquet, the committer's second write, Dagster runs, DuckDB checks).
Also measures the freshness of one small event: ingest -> visible in the table, in-process.

    python bench/pipeline_throughput.py [--events 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml


def _events(count: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    return [
        json.dumps(
            {
                "order_id": index,
                "customer_id": rng.randint(1, 100_000),
                "amount": round(rng.uniform(1, 1000), 2),
                "currency": rng.choice(["EUR", "USD", "GBP"]),
                "status": rng.choice(["created", "paid", "shipped", "cancelled"]),
                "ts": (start + timedelta(seconds=rng.randint(0, 7 * 86400))).isoformat(),
            }
        )
        for index in range(count)
    ]


STREAM = {
    "name": "bench_orders",
    "table_identifier": "bench.orders",
    "auto_create": True,
    "schema": {
        "columns": [
            {"name": "order_id", "type": "long", "required": True},
            {"name": "customer_id", "type": "long"},
            {"name": "amount", "type": "double"},
            {"name": "currency", "type": "string"},
            {"name": "status", "type": "string"},
            {"name": "ts", "type": "timestamptz"},
        ],
        "partition_spec": [{"column": "ts", "transform": "day"}],
    },
    "table_properties": {"format-version": "2"},
    "flush": {"max_bytes": 256 * 1024 * 1024, "max_age": "60s"},
    "commit_interval": "0s",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="lakehouse-bench-"))
    os.environ["LAKEHOUSE_HOME"] = str(workdir / "home")
    os.environ["DAGSTER_HOME"] = str(workdir / "dagster")
    (workdir / "dagster").mkdir()
    config_file = workdir / "lakehouse.yaml"
    config_file.write_text(yaml.safe_dump({"streams": [STREAM]}))
    os.environ["LAKEHOUSE_CONFIG"] = str(config_file)

    import dagster as dg
    import pyspark

    from lakehouse_assets.config import load_config
    from lakehouse_assets.definitions import build_definitions
    from lakehouse_assets.duck import iceberg_connection, scan
    from lakehouse_assets.landing import land_events, landing_dir, list_landing_files
    from lakehouse_assets.paths import LakehousePaths
    from lakehouse_assets.runner import run_until_idle
    from lakehouse_assets.spark import lakehouse_session
    from lakehouse_assets.table_metadata import current_metadata_location, load_committed_table

    config, paths = load_config(), LakehousePaths.from_env()
    stream = config.stream("bench_orders")
    lines = _events(args.events)
    land_events(paths, stream, lines, origin="bench")
    files = [str(landing_dir(paths, stream) / f.name) for f in list_landing_files(landing_dir(paths, stream))]
    megabytes = sum(os.path.getsize(f) for f in files) / 1e6
    spark = lakehouse_session(config, paths)

    # Warm the JVM once so neither side pays the first-query cost.
    spark.read.json(files[0]).limit(1000).count()

    schema = "order_id long, customer_id long, amount double, currency string, status string, ts timestamp"
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.baseline")
    spark.sql(
        f"CREATE TABLE lake.baseline.orders ({schema}) USING iceberg PARTITIONED BY (days(ts)) "
        "TBLPROPERTIES ('format-version'='2')"
    )
    started = time.perf_counter()
    spark.read.schema(schema).json(files).writeTo("lake.baseline.orders").append()
    baseline_seconds = time.perf_counter() - started

    with dg.DagsterInstance.get() as instance:
        defs = build_definitions(config)
        started = time.perf_counter()
        report = run_until_idle(defs, instance, log=lambda _: None)
        pipeline_seconds = time.perf_counter() - started
        assert not report.failed, report.failed
        run_seconds = {
            record.dagster_run.job_name: record.end_time - record.start_time for record in instance.get_run_records()
        }

        land_events(paths, stream, _events(1, seed=99)[:1])
        started = time.perf_counter()
        run_until_idle(defs, instance, log=lambda _: None)
        freshness_seconds = time.perf_counter() - started

    table = load_committed_table(config, paths, "bench.orders")
    location = current_metadata_location(config, paths, "bench.orders")
    rows = iceberg_connection().sql(f"SELECT count(*) FROM {scan(location, table.current_snapshot().snapshot_id)}")
    assert rows.fetchone()[0] == args.events + 1

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"Spark {pyspark.__version__} local[2], Dagster {dg.__version__}"
    )
    print(f"events: {args.events} ({megabytes:.0f} MB NDJSON in {len(files)} files)")
    print(f"bare Spark JSON -> Iceberg append: {baseline_seconds:.1f} s, {args.events / baseline_seconds:,.0f} rows/s")
    print(
        f"full pipeline (sensor, writer, committer, 4 DuckDB checks): {pipeline_seconds:.1f} s, "
        f"{args.events / pipeline_seconds:,.0f} rows/s"
    )
    print(f"ratio pipeline/bare: {baseline_seconds / pipeline_seconds:.2f}")
    for job_name, seconds in sorted(run_seconds.items()):
        print(f"  run {job_name}: {seconds:.1f} s")
    print(f"freshness of one event (ingest -> committed and checked, in-process): {freshness_seconds:.1f} s")


if __name__ == "__main__":
    main()
