"""What a JDBC catalog on PostgreSQL costs against the embedded Hadoop catalog, per pipeline round.

One process, one warm Spark driver (local[2]) for both: for each catalog, the same two-stream
pipeline (an append stream and a change stream) runs ROUNDS rounds of `run --until-idle`, each over
new events; the first round (table creation, JIT warm-up) is left out of the figures. On the JDBC
catalog every commit goes through a pass branch (create, write, fast-forward, drop: three metadata
commits more than on Hadoop), so the script also times those three steps alone on a warm table.

    python bench/catalog_commits.py [--rounds 8] [--orders 2000] [--changes 500]

Needs PostgreSQL's server programs and JDBC driver (Debian: postgresql, libpostgresql-jdbc-java).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import yaml

STREAMS = [
    {
        "name": "orders",
        "table_identifier": "sales.orders",
        "schema": {
            "columns": [{"name": "order_id", "type": "long", "required": True}, {"name": "amount", "type": "double"}]
        },
        "flush": {"max_bytes": 100_000_000, "max_age": "1h"},
        "auto_create": True,
        "commit_interval": "0s",
        "maintenance": {"schedule": None},
    },
    {
        "name": "customers",
        "table_identifier": "crm.customers",
        "operation": "${/op}",
        "identifier_columns": ["id"],
        "schema": {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"}]},
        "flush": {"max_bytes": 100_000_000, "max_age": "1h"},
        "auto_create": True,
        "commit_interval": "0s",
        "maintenance": {"schedule": None},
    },
]


def _use(workdir: Path, catalog: dict, jars: str) -> None:
    (workdir / "dagster").mkdir(parents=True)
    config = {"catalog": catalog, "spark": {"spark.jars": jars}, "streams": STREAMS}
    (workdir / "lakehouse.yaml").write_text(yaml.safe_dump(config))
    os.environ.update(
        LAKEHOUSE_HOME=str(workdir / "home"),
        DAGSTER_HOME=str(workdir / "dagster"),
        LAKEHOUSE_CONFIG=str(workdir / "lakehouse.yaml"),
    )


def _rounds(rounds: int, orders: int, changes: int) -> list[float]:
    import dagster as dg

    from lakehouse_assets.batches.landing import land_events
    from lakehouse_assets.definitions import build_definitions
    from lakehouse_assets.lakehouse import Lakehouse
    from lakehouse_assets.runner import run_until_idle

    lake = Lakehouse.from_env()
    seconds = []
    with dg.DagsterInstance.get() as instance:
        for number in range(rounds):
            first = number * orders
            appends = [json.dumps({"order_id": first + i, "amount": i * 0.5}) for i in range(orders)]
            land_events(lake.paths, lake.stream("orders"), appends)
            land_events(
                lake.paths,
                lake.stream("customers"),
                [json.dumps({"op": "u" if i % 3 else "c", "id": i, "name": f"n{number}-{i}"}) for i in range(changes)],
            )
            started = time.monotonic()
            report = run_until_idle(build_definitions(lake.config), instance, log=lambda _: None)
            seconds.append(time.monotonic() - started)
            assert not report.failed, report.failed
    return seconds[1:]


def _pass_branch_steps(samples: int) -> dict[str, list[float]]:
    from lakehouse_assets.commit.pass_branches import drop_pass_branch, open_pass_branch, publish_pass_branch
    from lakehouse_assets.engine.spark import lakehouse_session
    from lakehouse_assets.lakehouse import Lakehouse

    lake = Lakehouse.from_env()
    spark = lakehouse_session(lake)
    steps: dict[str, list[float]] = {}
    row = spark.createDataFrame([(10**9, 1.0)], "order_id bigint, amount double")

    def timed(step: str, action, *args) -> None:
        started = time.monotonic()
        action(*args)
        steps.setdefault(step, []).append(time.monotonic() - started)

    for sample in range(samples):
        head = lake.table("sales.orders").current_snapshot().snapshot_id
        name = f"lakehouse_pass_bench_{sample}"
        timed("create branch", open_pass_branch, spark, "sales.orders", name, head)
        timed("append 1 row on it", row.writeTo(f"lake.sales.orders.branch_{name}").append)
        timed("fast-forward main", publish_pass_branch, spark, "sales.orders", name, "main")
        timed("drop branch", drop_pass_branch, spark, "sales.orders", name)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--orders", type=int, default=2000)
    parser.add_argument("--changes", type=int, default=500)
    args = parser.parse_args()

    import pyspark

    from lakehouse_assets_tests.postgres_server import SERVER_USER, jdbc_driver_jar, postgres_server

    base = Path(tempfile.mkdtemp(prefix="lakehouse-catalog-bench-"))
    jar = jdbc_driver_jar()
    with postgres_server() as server:
        uri = server.create_database("iceberg")
        _use(base / "hadoop", {"type": "hadoop", "warehouse": str(base / "hadoop" / "warehouse")}, jar)
        hadoop = _rounds(args.rounds, args.orders, args.changes)
        _use(base / "jdbc", {"type": "jdbc", "uri": uri, "jdbc.user": SERVER_USER}, jar)
        jdbc = _rounds(args.rounds, args.orders, args.changes)
        steps = _pass_branch_steps(10)

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; Spark {pyspark.__version__} local[2], Iceberg 1.10.2, "
        f"PostgreSQL on loopback; {args.orders} appends + {args.changes} changes per round, "
        f"{args.rounds - 1} rounds measured (warm driver)"
    )
    print("catalog | round s: median | max | ratio to hadoop (median)")
    for name, seconds in (("hadoop", hadoop), ("jdbc", jdbc)):
        ratio = statistics.median(seconds) / statistics.median(hadoop)
        print(f"{name:7} | {statistics.median(seconds):6.2f} | {max(seconds):6.2f} | {ratio:.2f}")
    print("pass-branch step on the JDBC catalog | median s")
    for step, seconds in steps.items():
        print(f"{step:22} | {statistics.median(seconds):.3f}")


if __name__ == "__main__":
    main()
