"""Full-pipeline throughput against a bare Spark JSON -> Iceberg append of the same events.

Both run as cold processes, as a user runs them: a bare Spark JSON -> Iceberg append of the landed
files, and ``lakehouse run --until-idle`` (landing sensor, writer run writing the batch once into a
staged snapshot and publishing it with the ``lakehouse.*`` keys, DuckDB checks, every run recorded
in Dagster). The ratio is what the pipeline adds. Also measures one more event through a cold
``lakehouse run --until-idle``. Run-to-run noise on a small machine is large (the bare append alone
varies by a fifth), so it repeats the rounds, each in a fresh home, and prints the median ratio.

    python bench/pipeline_throughput.py [--events 1000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
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


@dataclass
class Round:
    """One round's cold processes, in seconds, and where the pipeline's writer run spent its time."""

    bare: float
    pipeline: float
    one_more_event: float
    runs: dict[str, float]
    staging: float

    @property
    def ratio(self) -> float:
        return self.bare / self.pipeline


def _round(events: list[str]) -> tuple[Round, list[str]]:
    """Land ``events`` in a fresh home, time the bare append and the pipeline over the same files
    (each a cold process), then one more event; DuckDB counts the table's rows against the events."""
    import dagster as dg

    from lakehouse_assets.batches.landing import land_events, landing_dir, list_landing_files
    from lakehouse_assets.lakehouse import Lakehouse
    from lakehouse_assets.quality.duck import iceberg_connection, scan

    workdir = Path(tempfile.mkdtemp(prefix="lakehouse-bench-"))
    os.environ["LAKEHOUSE_HOME"] = str(workdir / "home")
    os.environ["DAGSTER_HOME"] = str(workdir / "dagster")
    (workdir / "dagster").mkdir()
    config_file = workdir / "lakehouse.yaml"
    config_file.write_text(yaml.safe_dump({"streams": [STREAM]}))
    os.environ["LAKEHOUSE_CONFIG"] = str(config_file)

    lake = Lakehouse.from_env()
    stream = lake.stream("bench_orders")
    land_events(lake.paths, stream, events, origin="bench")
    files = [str(landing_dir(lake.paths, stream) / f.name) for f in list_landing_files(landing_dir(lake.paths, stream))]

    # Both sides are cold processes: each starts Python and a Spark JVM, reads the same files and
    # writes one Iceberg table.
    lakehouse = [sys.executable, "-m", "lakehouse_assets.cli.main", "run", "--until-idle"]
    bare_seconds = _timed([sys.executable, "-c", BARE_APPEND, *files])
    pipeline_seconds = _timed(lakehouse)

    with dg.DagsterInstance.get() as instance:
        records = instance.get_run_records()
        runs = {record.dagster_run.job_name: record.end_time - record.start_time for record in records}
        stage = instance.get_latest_materialization_event(dg.AssetKey(["staging", "bench_orders_batches"]))
        staging = stage.asset_materialization.metadata["stage_seconds"].value

    land_events(lake.paths, stream, _events(1, seed=99)[:1])
    one_more_seconds = _timed(lakehouse)

    table = lake.table("bench.orders")
    location = lake.metadata_location("bench.orders")
    rows = iceberg_connection().sql(f"SELECT count(*) FROM {scan(location, table.current_snapshot().snapshot_id)}")
    assert rows.fetchone()[0] == len(events) + 1
    shutil.rmtree(workdir)
    return Round(bare_seconds, pipeline_seconds, one_more_seconds, runs, staging), files


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of bare append, pipeline, one more event")
    args = parser.parse_args()

    import dagster as dg
    import pyspark

    events = _events(args.events)
    megabytes = sum(len(event) + 1 for event in events) / 1e6
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"Spark {pyspark.__version__} local[2], Dagster {dg.__version__}"
    )
    rounds = []
    for number in range(1, args.rounds + 1):
        result, files = _round(events)
        rounds.append(result)
        if number == 1:
            print(f"events: {args.events} ({megabytes:.0f} MB NDJSON in {len(files)} files)")
        print(
            f"round {number}: bare Spark JSON -> Iceberg append {result.bare:.1f} s, "
            f"`lakehouse run --until-idle` {result.pipeline:.1f} s (writer run "
            + ", ".join(f"{seconds:.1f} s" for _, seconds in sorted(result.runs.items()))
            + f", of which staging with the Spark session's start {result.staging} s), "
            f"ratio bare/pipeline {result.ratio:.2f}; one more event {result.one_more_event:.1f} s"
        )
    ratios = [result.ratio for result in rounds]
    bare, pipeline = statistics.median(r.bare for r in rounds), statistics.median(r.pipeline for r in rounds)
    # A round's ratio carries the noise of both its runs; the ratio of the medians carries less.
    print(
        f"ratio bare/pipeline: median {statistics.median(ratios):.2f} of {len(ratios)} rounds "
        f"(min {min(ratios):.2f}, max {max(ratios):.2f}); bare {bare:.1f} s, pipeline {pipeline:.1f} s, "
        f"one more event {statistics.median(r.one_more_event for r in rounds):.1f} s (medians); "
        f"median bare / median pipeline {bare / pipeline:.2f}"
    )


if __name__ == "__main__":
    main()
