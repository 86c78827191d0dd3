"""Full-pipeline throughput against a bare Spark JSON -> Iceberg append of the same events.

Both run as cold processes, as a user runs them: a bare Spark JSON -> Iceberg append of the landed
files, and ``lakehouse run --until-idle`` (landing sensor, writer run writing the batch once into a
staged snapshot and publishing it with the ``lakehouse.*`` keys, DuckDB checks, every run recorded
in Dagster). The ratio is what the pipeline adds. Also measures one more event through a cold
``lakehouse run --until-idle``.

    python bench/pipeline_throughput.py [--events 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
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


BARE_APPEND = """
import sys, time
started = time.perf_counter()
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.engine.spark import lakehouse_session
spark = lakehouse_session(Lakehouse.from_env())
schema = "order_id long, customer_id long, amount double, currency string, status string, ts timestamp"
spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.baseline")
spark.sql(
    f"CREATE TABLE lake.baseline.orders ({schema}) USING iceberg PARTITIONED BY (days(ts)) "
    "TBLPROPERTIES ('format-version'='2')"
)
spark.read.schema(schema).json(sys.argv[1:]).writeTo("lake.baseline.orders").append()
print(f"bare append done in {time.perf_counter() - started:.1f} s")
"""


def _timed(command: list[str]) -> float:
    """Wall time of a command run to completion as its own process (a cold JVM); fails loudly."""
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if completed.returncode != 0:
        raise SystemExit(f"{command[:3]} failed:\n{completed.stdout[-2000:]}{completed.stderr[-3000:]}")
    return seconds


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

    from lakehouse_assets.ingest.landing import land_events, landing_dir, list_landing_files
    from lakehouse_assets.lakehouse import Lakehouse
    from lakehouse_assets.quality.duck import iceberg_connection, scan

    lake = Lakehouse.from_env()
    stream = lake.stream("bench_orders")
    land_events(lake.paths, stream, _events(args.events), origin="bench")
    files = [str(landing_dir(lake.paths, stream) / f.name) for f in list_landing_files(landing_dir(lake.paths, stream))]
    megabytes = sum(os.path.getsize(f) for f in files) / 1e6

    # Both sides are cold processes: each starts Python and a Spark JVM, reads the same files and
    # writes one Iceberg table.
    lakehouse = [sys.executable, "-m", "lakehouse_assets.cli", "run", "--until-idle"]
    baseline_seconds = _timed([sys.executable, "-c", BARE_APPEND, *files])
    pipeline_seconds = _timed(lakehouse)

    with dg.DagsterInstance.get() as instance:
        run_seconds = {
            record.dagster_run.job_name: record.end_time - record.start_time for record in instance.get_run_records()
        }
        stage = instance.get_latest_materialization_event(dg.AssetKey(["staging", "bench_orders"]))
        stage_metadata = {key: entry.value for key, entry in stage.asset_materialization.metadata.items()}

    land_events(lake.paths, stream, _events(1, seed=99)[:1])
    freshness_seconds = _timed(lakehouse)

    table = lake.table("bench.orders")
    location = lake.metadata_location("bench.orders")
    rows = iceberg_connection().sql(f"SELECT count(*) FROM {scan(location, table.current_snapshot().snapshot_id)}")
    assert rows.fetchone()[0] == args.events + 1

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"Spark {pyspark.__version__} local[2], Dagster {dg.__version__}"
    )
    print(f"events: {args.events} ({megabytes:.0f} MB NDJSON in {len(files)} files)")
    print(
        f"bare Spark JSON -> Iceberg append, cold process: {baseline_seconds:.1f} s, "
        f"{args.events / baseline_seconds:,.0f} rows/s"
    )
    print(
        f"`lakehouse run --until-idle`, cold process (sensor, writer run staging and committing, DuckDB checks): "
        f"{pipeline_seconds:.1f} s, {args.events / pipeline_seconds:,.0f} rows/s"
    )
    print(f"ratio bare/pipeline: {baseline_seconds / pipeline_seconds:.2f}")
    for job_name, seconds in sorted(run_seconds.items()):
        print(f"  run {job_name}: {seconds:.1f} s")
    print(f"  of which staging (Spark session start included): {stage_metadata.get('stage_seconds')} s")
    print(f"one more event, cold `lakehouse run --until-idle` to committed and checked: {freshness_seconds:.1f} s")


if __name__ == "__main__":
    main()
