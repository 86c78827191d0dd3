"""Iceberg CDC source: change events/s against a plain scan of the same files, side by side.

A source table of N rows (format v2, 8 buckets) gets one UPDATE of 10% of its rows, spread over
every file, or (third case) of the 10% that fall in one bucket. With copy-on-write the snapshot
rewrites the files it touches, so the changelog reads the old and the new files and removes the
unchanged rows as carryover; with merge-on-read the snapshot adds delete files and the changes come
from comparing the table at the snapshot with its parent in the touched partitions. The baseline
reads the same two table versions in full and serializes them the same way (to JSON), without
computing changes. Both write to Spark's no-op sink, in the same session.

    python bench/cdc_changelog.py [--rows 1000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import yaml

# (name, write mode, rows updated): every bucket touched, or one bucket of eight.
CASES = (
    ("cow_all", "copy-on-write", "id % 10 = 0"),
    ("mor_all", "merge-on-read", "id % 10 = 0"),
    ("mor_one", "merge-on-read", "id % 10 = 0 AND lake.system.bucket(8, id) = 0"),
)


def best_seconds(frame, repeats: int) -> float:
    """The fastest of ``repeats`` full evaluations of ``frame()`` into Spark's no-op sink."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        frame().write.format("noop").mode("overwrite").save()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="lakehouse-cdc-bench-"))
    os.environ["LAKEHOUSE_HOME"] = str(workdir / "home")
    streams = [
        {
            "name": name,
            "source": {"iceberg": {"table": f"src.{name}", "identifier_columns": ["id"]}},
            "table_identifier": f"mirror.{name}",
        }
        for name, _, _ in CASES
    ]
    config_file = workdir / "lakehouse.yaml"
    config_file.write_text(yaml.safe_dump({"streams": streams}))
    os.environ["LAKEHOUSE_CONFIG"] = str(config_file)

    import pyspark
    from pyspark.sql import functions as F

    from lakehouse_assets.engine.spark import lakehouse_session
    from lakehouse_assets.lakehouse import Lakehouse
    from lakehouse_assets.source.iceberg_source import snapshot_changes

    lake = Lakehouse.from_env()
    spark = lakehouse_session(lake)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; Spark {pyspark.__version__} local[2], "
        f"Iceberg 1.10.2; {args.rows} rows in 8 buckets, one UPDATE; best of {args.repeats}"
    )
    print("case | mode | updated rows | change events | changes s | events/s | plain scan s | changes/scan")
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.src")
    for case, mode, updated in CASES:
        stream = lake.stream(case)
        table = stream.iceberg_source.table
        spark.sql(
            f"CREATE TABLE lake.{table} (id bigint NOT NULL, name string, amount double) USING iceberg "
            f"PARTITIONED BY (bucket(8, id)) TBLPROPERTIES ('format-version' = '2', "
            f"'write.update.mode' = '{mode}', 'write.delete.mode' = '{mode}')"
        )
        name = F.concat(F.lit("name-"), F.col("id").cast("string")).alias("name")
        spark.range(args.rows).select("id", name, (F.col("id") / 7).alias("amount")).writeTo(f"lake.{table}").append()
        spark.sql(f"UPDATE lake.{table} SET amount = amount + 1 WHERE {updated}")
        source = lake.table(table)
        snapshot = source.current_snapshot()
        versions = [
            spark.read.option("snapshot-id", str(snapshot_id)).table(f"lake.{table}")
            for snapshot_id in (snapshot.parent_snapshot_id, snapshot.snapshot_id)
        ]

        def changes(stream=stream, source=source, snapshot=snapshot):
            return snapshot_changes(spark, stream, source, snapshot)

        def plain_scan(versions=versions):
            return versions[0].unionByName(versions[1]).select(F.to_json(F.struct("*")).alias("value"))

        events = changes().count()
        change_seconds, scan_seconds = best_seconds(changes, args.repeats), best_seconds(plain_scan, args.repeats)
        print(
            f"{case} | {mode} | {updated} | {events} | {change_seconds:.2f} | {events / change_seconds:,.0f} | "
            f"{scan_seconds:.2f} | {change_seconds / scan_seconds:.2f}x"
        )


if __name__ == "__main__":
    main()
