"""Many routed tables through one stream, against a bare Spark job writing the same tables.

The same events are routed to N tables (``table_identifier: "t.${/tenant}"``, auto-created) and,
in the same run, written by a bare Spark job (read once, one ``writeTo(...).append()`` per table
into tables it created). Reports wall time, runs launched and DuckDB's count of every table
against the oracle, in-process (``lakehouse run --until-idle``) and, with ``--dagster-dev``, under
``dagster dev`` (time until every event is visible, runs by job, code-location load time, sensor
count).

    python bench/many_tables.py [--tables 10 100 500] [--events 20000] [--dagster-dev]
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
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

STREAM = "tenant_events"
NAMESPACE = "t"
ROUTER = {
    "name": STREAM,
    "table_identifier": NAMESPACE + ".${/tenant}",
    "auto_create": True,
    "commit_interval": "0s",
    "flush": {"max_bytes": 64 * 1024 * 1024, "max_age": "15s"},
    "maintenance": {"schedule": "0 3 * * *"},
}
BARE_WRITE = """
import sys, time
started = time.perf_counter()
from pyspark.sql import functions as F
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.engine.spark import lakehouse_session
spark = lakehouse_session(Lakehouse.from_env())
schema = "tenant string, id long, amount double, ts timestamp"
events = spark.read.schema(schema).json(sys.argv[1:]).cache()
tenants = sorted(row[0] for row in events.select("tenant").distinct().collect())
spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.baseline")
for tenant in tenants:
    spark.sql(f"CREATE TABLE lake.baseline.{tenant} ({schema}) USING iceberg")
    events.where(F.col("tenant") == tenant).writeTo(f"lake.baseline.{tenant}").append()
print(f"bare: {len(tenants)} tables in {time.perf_counter() - started:.1f} s")
"""


def tenant_name(index: int) -> str:
    return f"tenant_{index:04d}"


def events(count: int, tables: int, seed: int = 7) -> list[str]:
    """``count`` events spread evenly over ``tables`` tenants (every tenant gets events)."""
    rng = random.Random(seed)
    return [
        json.dumps(
            {
                "tenant": tenant_name(index % tables),
                "id": index,
                "amount": round(rng.uniform(1, 100), 2),
                "ts": f"2026-11-{1 + index % 28:02d}T{index % 24:02d}:00:00+00:00",
            }
        )
        for index in range(count)
    ]


def setup(workdir: Path) -> dict[str, str]:
    """A fresh home with the router stream; the environment a run needs."""
    env = dict(os.environ)
    env.update(
        LAKEHOUSE_HOME=str(workdir / "home"),
        DAGSTER_HOME=str(workdir / "dagster"),
        LAKEHOUSE_CONFIG=str(workdir / "lakehouse.yaml"),
    )
    (workdir / "dagster").mkdir(parents=True)
    (workdir / "lakehouse.yaml").write_text(yaml.safe_dump({"streams": [ROUTER]}))
    project_settings = Path(__file__).resolve().parent.parent / "dagster.yaml"
    (workdir / "dagster" / "dagster.yaml").write_text(project_settings.read_text())
    os.environ.update(env)
    return env


def landed_files(payload: list[str]) -> list[str]:
    """Land ``payload`` in the router's landing directory, as ``lakehouse ingest`` does."""
    from lakehouse_assets.batches.landing import land_events, landing_dir, list_landing_files
    from lakehouse_assets.config.loader import load_config
    from lakehouse_assets.paths import LakehousePaths

    stream = load_config().stream(STREAM)
    paths = LakehousePaths.from_env()
    land_events(paths, stream, payload, origin="bench")
    directory = landing_dir(paths, stream)
    return [str(directory / entry.name) for entry in list_landing_files(directory)]


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall time and output of a command run to completion as its own process; fails loudly."""
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - started
    if completed.returncode != 0:
        raise SystemExit(f"{command[:4]} failed:\n{completed.stdout[-3000:]}{completed.stderr[-3000:]}")
    return seconds, completed.stdout


def verify(payload: list[str], tables: int) -> int:
    """DuckDB's row count and distinct ids of every routed table against the oracle; the events found."""
    from lakehouse_assets.lakehouse import Lakehouse
    from lakehouse_assets.quality.duck import iceberg_connection, scan

    lake = Lakehouse.from_env()
    expected = Counter(json.loads(line)["tenant"] for line in payload)
    connection = iceberg_connection()
    found = 0
    for index in range(tables):
        identifier = f"{NAMESPACE}.{tenant_name(index)}"
        table = lake.table(identifier)
        if table is None or table.current_snapshot() is None:
            raise SystemExit(f"{identifier} was never committed")
        snapshot = scan(lake.metadata_location(identifier), table.current_snapshot().snapshot_id)
        rows, ids = connection.sql(f"SELECT count(*), count(DISTINCT id) FROM {snapshot}").fetchone()
        if rows != expected[tenant_name(index)] or ids != rows:
            raise SystemExit(f"{identifier}: {rows} rows, {ids} distinct ids; expected {expected[tenant_name(index)]}")
        found += rows
    return found


def run_counts(dagster_home: Path) -> Counter:
    import dagster as dg

    os.environ["DAGSTER_HOME"] = str(dagster_home)
    with dg.DagsterInstance.get() as instance:
        return Counter(record.dagster_run.job_name for record in instance.get_run_records())


def in_process(tables: int, count: int) -> dict[str, Any]:
    """Bare Spark and ``lakehouse run --until-idle`` on the same landed events, each a cold process."""
    workdir = Path(tempfile.mkdtemp(prefix=f"lakehouse-many-{tables}-"))
    env = setup(workdir)
    payload = events(count, tables)
    files = landed_files(payload)
    bare_seconds, _ = timed([sys.executable, "-c", BARE_WRITE, *files], env)
    pipeline_seconds, _ = timed([sys.executable, "-m", "lakehouse_assets.cli.main", "run", "--until-idle"], env)
    found = verify(payload, tables)
    runs = run_counts(workdir / "dagster")
    return {
        "tables": tables,
        "events": found,
        "bare_seconds": round(bare_seconds, 1),
        "pipeline_seconds": round(pipeline_seconds, 1),
        "pipeline_over_bare": round(pipeline_seconds / bare_seconds, 2),
        "runs": dict(runs),
        "workdir": str(workdir),
    }


def visible_rows(tables: int) -> dict[str, int]:
    """Rows of each routed table's current snapshot (its summary's total), 0 while it has none."""
    from lakehouse_assets.lakehouse import Lakehouse

    lake = Lakehouse.from_env()
    found = {}
    for index in range(tables):
        table = lake.table(f"{NAMESPACE}.{tenant_name(index)}")
        snapshot = table.current_snapshot() if table else None
        found[tenant_name(index)] = int(snapshot.summary["total-records"]) if snapshot else 0
    return found


def wait_visible(
    expected: Counter, tables: int, since: float, timeout: float, process: Any, work: Any
) -> tuple[dict[str, float], float | None]:
    """Seconds from ``since`` until each table showed its expected rows; and until all did (None: timeout)."""
    import dagster_dev_freshness as dev

    visible_after: dict[str, float] = {}
    while time.time() - since < timeout:
        dev.ensure_running(process, work)
        now = time.time()
        for tenant, rows in visible_rows(tables).items():
            if tenant not in visible_after and rows >= expected[tenant]:
                visible_after[tenant] = now - since
        if len(visible_after) == tables:
            return visible_after, max(visible_after.values())
        time.sleep(2)
    return visible_after, None


def percentile(values: list[float], percent: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(percent / 100 * len(ordered) + 0.5) - 1))]


def load_code_location(args: argparse.Namespace, work: Any, port: int) -> tuple[Any, Any, float]:
    """Start ``dagster dev``; the process, its code location and the seconds until it was loaded."""
    import dagster_dev_freshness as dev

    started = time.time()
    process = dev.start_dagster(args, work, port)
    while True:
        dev.ensure_running(process, work)
        try:
            location = dev.loaded_location(port)
            if location is not None:
                return process, location, time.time() - started
        except (OSError, dev.GraphQLError, json.JSONDecodeError):
            pass
        if time.time() - started > args.startup_timeout:
            dev.stop_dagster(process, work)
            raise SystemExit(f"dagster dev did not load in {args.startup_timeout} s:\n{dev.log_tail(work)}")
        time.sleep(0.5)


def under_dagster_dev(args: argparse.Namespace, tables: int, count: int) -> dict[str, Any]:
    """Two rounds of ``count`` events over ``tables`` tables under ``dagster dev``: the first while
    the tables are new to the code location, the second after a restart that loads them all."""
    import dagster_dev_freshness as dev

    workdir = Path(tempfile.mkdtemp(prefix=f"lakehouse-many-dev-{tables}-"))
    env = setup(workdir)
    env.update(PATH=f"{dev.BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1")
    work = dev.Workdir(
        workdir, workdir / "home", workdir / "dagster", workdir / "lakehouse.yaml", workdir / "dagster-dev.log", env
    )
    result: dict[str, Any] = {"tables": tables, "workdir": str(workdir)}
    landed: list[str] = []
    for round_name in ("first_round", "after_restart"):
        port = dev.free_port()
        process, location, load_seconds = load_code_location(args, work, port)
        try:
            payload = events(count, tables, seed=len(landed))
            payload = [json.dumps({**json.loads(line), "id": len(landed) + i}) for i, line in enumerate(payload)]
            instance = dev.open_instance(work)
            runs_before = Counter(run.job_name for run in instance.get_runs())
            since = time.time()
            landed_files(payload)
            landed += payload
            expected = Counter(json.loads(line)["tenant"] for line in landed)
            visible_after, all_visible = wait_visible(expected, tables, since, args.visible_timeout, process, work)
            # A run reports its commits after making them: let it finish before stopping dagster dev.
            deadline = time.time() + args.visible_timeout
            while dev.runs_in_progress(instance) and time.time() < deadline:
                time.sleep(2)
            runs = Counter(run.job_name for run in instance.get_runs()) - runs_before
            repository = {"repositoryLocationName": location.location, "repositoryName": location.repository}
            sensors = dev.graphql(port, SENSOR_COUNT_QUERY, {"repository": repository})["sensorsOrError"]
        finally:
            dev.stop_dagster(process, work)
        freshness = list(visible_after.values())
        result[round_name] = {
            "code_location_load_seconds": round(load_seconds, 1),
            "sensors": len(sensors.get("results", [])),
            "all_visible_seconds": round(all_visible, 1) if all_visible is not None else None,
            "tables_visible": len(visible_after),
            "freshness_p50": round(percentile(freshness, 50), 1) if freshness else None,
            "freshness_p95": round(percentile(freshness, 95), 1) if freshness else None,
            "runs": dict(runs),
        }
    result["events"] = verify(landed, tables)
    return result


SENSOR_COUNT_QUERY = """
query Sensors($repository: RepositorySelector!) {
  sensorsOrError(repositorySelector: $repository) { __typename ... on Sensors { results { name } } }
}
"""


def versions() -> str:
    import dagster as dg
    import duckdb
    import pyspark

    return (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, Spark "
        f"{pyspark.__version__} local[2], Dagster {dg.__version__}, DuckDB {duckdb.__version__}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, nargs="+", default=[10, 100, 500])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--dagster-dev", action="store_true", help="measure under dagster dev instead")
    parser.add_argument("--visible-timeout", type=float, default=900, help="seconds to wait for every table")
    parser.add_argument("--startup-timeout", type=float, default=300, help="seconds to wait for dagster dev")
    args = parser.parse_args(argv)
    args.project_root = Path(__file__).resolve().parent.parent
    print(versions())
    for tables in args.tables if args.dagster_dev else []:
        result = under_dagster_dev(args, tables, args.events)
        print(json.dumps(result), flush=True)
    for tables in [] if args.dagster_dev else args.tables:
        result = in_process(tables, args.events)
        print(json.dumps(result))
        print(
            f"{tables} tables, {result['events']} events: bare {result['bare_seconds']} s, "
            f"`lakehouse run --until-idle` {result['pipeline_seconds']} s "
            f"({result['pipeline_over_bare']}x), {sum(result['runs'].values())} runs",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
