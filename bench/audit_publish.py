"""What ``publish: audit`` adds per commit, against ``publish: direct`` on the same batches.

Two streams with the same schema land the same events, batch by batch, in one Spark session:
one writes its table directly, the other commits to the table's audit branch and then publishes
(dead letters, then main moved to the audited snapshot). Both stage the same way and run the same checks, so
the difference per batch is the audit commit against the direct one, plus the publish step.
Batches alternate between the two streams so neither gets a warmer JVM. Also shows that publishing
rewrites no data: both tables end with the same data files and main's snapshot count.

    python bench/audit_publish.py [--batches 20] [--events 20000] [--no-dead-letters]

With a dead letter in every batch (the default), the direct commit includes the dead-letter
table's append, which the audited stream makes when it publishes.
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

COLUMNS = [
    {"name": "order_id", "type": "long", "required": True},
    {"name": "customer_id", "type": "long"},
    {"name": "amount", "type": "double"},
    {"name": "status", "type": "string"},
]


def _stream(name: str, publish: str) -> dict:
    return {
        "name": name,
        "table_identifier": f"bench.{name}",
        "auto_create": True,
        "publish": publish,
        "operation": "${/op}",
        "identifier_columns": ["order_id"],
        "schema": {"columns": COLUMNS, "partition_spec": [{"column": "order_id", "transform": "bucket[4]"}]},
        "table_properties": {"format-version": "2", "write.merge.mode": "merge-on-read"},
        "maintenance": {"schedule": None},
    }


def _batch(number: int, events: int, dead_letter: bool) -> list[str]:
    """Upserts of ``events`` keys out of ten times as many, one in fifty a delete, and one dead letter."""
    rng = random.Random(number)
    lines = []
    for _ in range(events):
        key = rng.randrange(events * 10)
        op = "d" if rng.random() < 0.02 else "u"
        lines.append(json.dumps({"op": op, "order_id": key, "amount": round(rng.uniform(1, 500), 2), "status": "paid"}))
    if dead_letter:
        lines.append(json.dumps({"op": "u", "note": "no order_id: a dead letter"}))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument(
        "--no-dead-letters", action="store_true", help="batches without dead letters: publishing is a fast-forward only"
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="lakehouse-audit-bench-"))
    os.environ["LAKEHOUSE_HOME"] = str(workdir / "home")
    config_file = workdir / "lakehouse.yaml"
    config_file.write_text(yaml.safe_dump({"streams": [_stream("direct", "direct"), _stream("audited", "audit")]}))
    os.environ["LAKEHOUSE_CONFIG"] = str(config_file)

    import pyspark

    from lakehouse_assets.batches.landing import land_events
    from lakehouse_assets.commit.publishing import publish_table
    from lakehouse_assets.engine.spark import lakehouse_session
    from lakehouse_assets.ingest.micro_batching import mint_next_batch
    from lakehouse_assets.ingest.staging import stage_batch
    from lakehouse_assets.ingest.table_commits import commit_table
    from lakehouse_assets.lakehouse import Lakehouse

    lake = Lakehouse.from_env()
    spark = lakehouse_session(lake)
    commit_seconds: dict[str, list[float]] = {"direct": [], "audited": []}
    publish_seconds: list[float] = []
    for number in range(args.batches):
        lines = _batch(number, args.events, dead_letter=not args.no_dead_letters)
        for name in ("direct", "audited") if number % 2 == 0 else ("audited", "direct"):
            stream = lake.stream(name)
            land_events(lake.paths, stream, lines, origin="bench")
            batch, _ = mint_next_batch(lake, stream, drain=True)
            stage_batch(spark, lake, stream, batch.sequence)
            started = time.perf_counter()
            outcome = commit_table(spark, lake, stream.table_identifier, f"bench-{number}")
            if name == "audited":
                committed = time.perf_counter()
                publish_table(spark, lake, stream.table_identifier, outcome.results[-1].snapshot_id, "bench")
                publish_seconds.append(time.perf_counter() - committed)
            commit_seconds[name].append(time.perf_counter() - started)

    # The first two batches create the tables and warm the JVM; they are left out.
    direct, audited = (statistics.median(commit_seconds[name][2:]) for name in ("direct", "audited"))
    publish = statistics.median(publish_seconds[2:])
    tables = {name: lake.table(f"bench.{name}") for name in ("direct", "audited")}
    files = {
        name: int(table.current_snapshot().summary.additional_properties["total-data-files"])
        for name, table in tables.items()
    }
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"Spark {pyspark.__version__} local[2]"
    )
    print(
        f"{args.batches} change batches of {args.events} events each (MERGE, merge-on-read, 4 buckets), "
        + ("no dead letters" if args.no_dead_letters else "one dead letter each")
    )
    print(f"direct: commit {direct:.2f} s per batch (median)")
    print(f"audit: commit to the audit branch + publish {audited:.2f} s per batch, of which publish {publish:.3f} s")
    print(f"ratio audit/direct: {audited / direct:.2f} (+{audited - direct:.2f} s per commit)")
    print(f"data files after the run: direct {files['direct']}, audit {files['audited']}")
    print(f"snapshots: direct {len(tables['direct'].snapshots())}, audit {len(tables['audited'].snapshots())}")


if __name__ == "__main__":
    main()
