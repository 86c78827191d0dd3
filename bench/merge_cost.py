"""Cost of committing a batch of 10k changes with MERGE as the table grows, against an append.

For each table size (100k, 1M, 5M rows; format v2, merge-on-read, bucketed by key) this commits
three batches of 10,000 net changes (70% updates, 20% inserts, 10% deletes) through the committer's
own write path (count the effect, then MERGE with the lakehouse.* summary keys), and appends the
same 10,000 rows to a copy of the table, in the same Spark session.

    python bench/merge_cost.py [--sizes 100000,1000000,5000000] [--changes 10000]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import yaml

BATCHES_PER_SIZE = 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100000,1000000,5000000")
    parser.add_argument("--changes", type=int, default=10_000)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="lakehouse-merge-bench-"))
    os.environ["LAKEHOUSE_HOME"] = str(workdir / "home")
    config_file = workdir / "lakehouse.yaml"
    config_file.write_text(yaml.safe_dump({"streams": [{"name": "bench", "table_identifier": "bench.unused"}]}))
    os.environ["LAKEHOUSE_CONFIG"] = str(config_file)

    import pyspark
    from pyspark.sql import functions as F

    from lakehouse_assets.batches.staged_format import OPERATION_COLUMN
    from lakehouse_assets.commit.table_writes import append_rows, count_changes, merge_changes
    from lakehouse_assets.commit.tables import MERGE_ON_READ_PROPERTIES
    from lakehouse_assets.engine.spark import lakehouse_session
    from lakehouse_assets.lakehouse import Lakehouse

    spark = lakehouse_session(Lakehouse.from_env())
    properties = ", ".join(f"'{k}'='{v}'" for k, v in {"format-version": "2", **MERGE_ON_READ_PROPERTIES}.items())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; Spark {pyspark.__version__} local[2], "
        f"Iceberg 1.10.2; {args.changes} net changes per batch"
    )
    print("table rows | batch | count+MERGE s (count s) | append s | MERGE/append | delete files in table")
    for size in (int(value) for value in args.sizes.split(",")):
        for name in ("merged", "appended"):
            spark.sql(f"DROP TABLE IF EXISTS lake.bench.{name}_{size}")
            spark.sql(
                f"CREATE TABLE lake.bench.{name}_{size} (id bigint NOT NULL, name string, amount double, ts timestamp) "
                f"USING iceberg PARTITIONED BY (bucket(8, id)) TBLPROPERTIES ({properties})"
            )
            spark.range(size).select(
                F.col("id"),
                F.concat(F.lit("customer-"), F.col("id").cast("string")).alias("name"),
                (F.col("id") % 1000 / 7).alias("amount"),
                F.timestamp_seconds(F.lit(1764000000) + F.col("id") % 86400).alias("ts"),
            ).writeTo(f"lake.bench.{name}_{size}").append()
        for batch in range(1, BATCHES_PER_SIZE + 1):
            seed = size + batch
            changes = (
                spark.range(args.changes)
                .select(
                    F.when(F.col("id") < args.changes * 0.9, (F.rand(seed) * size).cast("long"))
                    .otherwise(size + batch * args.changes + F.col("id"))
                    .alias("id"),
                    F.col("id").alias("n"),
                )
                .dropDuplicates(["id"])
                .select(
                    "id",
                    F.lit("changed").alias("name"),
                    F.rand(seed).alias("amount"),
                    F.current_timestamp().alias("ts"),
                    F.when(F.col("n") < args.changes * 0.1, F.lit("DELETE"))
                    .otherwise(F.lit("UPSERT"))
                    .alias(OPERATION_COLUMN),
                )
                .cache()
            )
            changes.count()
            started = time.perf_counter()
            counts = count_changes(spark, f"bench.merged_{size}", changes, ["id"])
            counted = time.perf_counter() - started
            merge_changes(
                spark,
                f"bench.merged_{size}",
                changes,
                ["id"],
                ["id", "name", "amount", "ts"],
                {"lakehouse.inserted": str(counts.inserted)},
                f"bench_changes_{batch}",
            )
            merged = time.perf_counter() - started
            started = time.perf_counter()
            append_rows(changes.drop(OPERATION_COLUMN), f"bench.appended_{size}", {"lakehouse.rows": str(args.changes)})
            appended = time.perf_counter() - started
            delete_files = spark.sql(f"SELECT count(*) FROM lake.bench.merged_{size}.delete_files").first()[0]
            print(
                f"{size:>10,} | {batch} | {merged:6.2f} ({counted:4.2f}) | {appended:6.2f} | "
                f"{merged / appended:5.1f} | {delete_files}"
            )
            changes.unpersist()


if __name__ == "__main__":
    main()
