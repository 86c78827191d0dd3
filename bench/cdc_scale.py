"""A change batch's commit as the table grows: does its cost track the batch or the table?

For each table size a change stream (``operation``, ``identifier_columns: [id]``, format 2,
``bucket[16]`` on the key) is loaded through the pipeline's own writer and committer (land, mint,
stage, commit, as ``lakehouse run`` does, in one process), then commits batches of net changes:
first with uniformly random keys (70% updates and 10% deletes of live keys, 20% new keys), then
with keys skewed to the newest tenth of the rows (what most OLTP tables see). The same events
are appended by a plain stream beside it, in the same process, as the baseline. Per batch: the
commit latency (``commit_latency_seconds``) and the end-to-end time (landing to committed). After
the batches DuckDB reads a count and a point query (median of 5), checked against an oracle.

Run it from a checkout of the code to measure (``--label`` names it in the output); run it from
another checkout (a git worktree of an older commit) to compare the two side by side.

    python bench/cdc_scale.py [--sizes 1000000,10000000] [--changes 10000] [--batches 4] [--label row-delta]
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

CHANGES = {
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
        ],
        "partition_spec": [{"column": "id", "transform": "bucket[16]"}],
    },
    "table_properties": {"format-version": "2"},
    "flush": {"max_bytes": 1 << 40, "max_age": "1h"},
    "commit_interval": "0s",
}
APPENDS = {
    "name": "appends",
    "table_identifier": "bench.appends",
    "auto_create": True,
    "schema": {"columns": CHANGES["schema"]["columns"] + [{"name": "op", "type": "string"}]},
    "table_properties": {"format-version": "2"},
    "flush": {"max_bytes": 1 << 40, "max_age": "1h"},
    "commit_interval": "0s",
}
LOAD_BATCH = 2_000_000


def _commit(spark, lake, stream_name: str, lines: list[str]):
    """Land ``lines`` as one batch and stage and commit it; the commit's result and the seconds
    from landing to committed."""
    from lakehouse_assets.batches.landing import land_events
    from lakehouse_assets.ingest.micro_batching import mint_next_batch
    from lakehouse_assets.ingest.staging import stage_batch
    from lakehouse_assets.ingest.table_commits import commit_table

    stream = lake.stream(stream_name)
    started = time.perf_counter()
    land_events(lake.paths, stream, lines)
    batch, _ = mint_next_batch(lake, stream, drain=True)
    stage_batch(spark, lake, stream, batch.sequence)
    [result] = commit_table(spark, lake, stream.table_identifier, "bench").results
    return result, time.perf_counter() - started


class Oracle:
    """The live keys (a bitmap) and the name of each key changed since the load."""

    def __init__(self, size: int) -> None:
        self.live = bytearray(b"\1") * size
        self.names: dict[int, str] = {}
        self.next_key = size

    def changes(self, randomness: random.Random, count: int, newest_fraction: float | None, tag: str) -> list[str]:
        """``count`` net changes: 70% updates and 10% deletes of distinct live keys (from the newest
        ``newest_fraction`` of the keys when given), 20% new keys."""
        low = 0 if newest_fraction is None else int(self.next_key * (1 - newest_fraction))
        existing: set[int] = set()
        while len(existing) < count * 8 // 10:
            key = randomness.randrange(low, self.next_key)
            if key < len(self.live) and self.live[key]:
                existing.add(key)
        lines = []
        for index, key in enumerate(sorted(existing, key=lambda _: randomness.random())):
            if index % 8 == 0:
                self.live[key] = 0
                lines.append(json.dumps({"op": "d", "id": key}))
            else:
                self.names[key] = f"{tag}-{key}"
                lines.append(json.dumps({"op": "u", "id": key, "name": self.names[key], "score": 1.0}))
        for _ in range(count - len(lines)):
            key = self.next_key
            self.next_key += 1
            self.live.append(1)
            self.names[key] = f"{tag}-{key}"
            lines.append(json.dumps({"op": "c", "id": key, "name": self.names[key], "score": 2.0}))
        return lines

    def name_of(self, key: int) -> str | None:
        return self.names.get(key, f"n{key}") if self.live[key] else None


def _queries(lake, oracle: Oracle, randomness: random.Random) -> tuple[float, float]:
    """DuckDB's count and point query (median of 5 each), checked against the oracle."""
    from lakehouse_assets.quality.duck import iceberg_connection, scan

    table = lake.require_table(CHANGES["table_identifier"])
    relation = scan(table.metadata_location, table.current_snapshot().snapshot_id)
    count_runs, point_runs = [], []
    for _ in range(5):
        connection = iceberg_connection()
        started = time.perf_counter()
        [(count,)] = connection.sql(f"SELECT count(*) FROM {relation}").fetchall()
        count_runs.append(time.perf_counter() - started)
        assert count == sum(oracle.live), f"DuckDB counts {count} rows, the oracle {sum(oracle.live)}"
        key = randomness.choice(list(oracle.names)) if oracle.names else 0
        started = time.perf_counter()
        rows = connection.sql(f"SELECT name FROM {relation} WHERE id = {key}").fetchall()
        point_runs.append(time.perf_counter() - started)
        expected = oracle.name_of(key)
        assert rows == ([(expected,)] if expected else []), f"key {key}: DuckDB reads {rows}, the oracle {expected}"
    return statistics.median(count_runs), statistics.median(point_runs)


def measure(workdir: Path, size: int, changes: int, batches: int) -> dict:
    directory = workdir / f"rows-{size}"
    directory.mkdir(parents=True)
    (directory / "lakehouse.yaml").write_text(yaml.safe_dump({"streams": [CHANGES, APPENDS]}))
    os.environ["LAKEHOUSE_HOME"] = str(directory / "home")
    os.environ["LAKEHOUSE_CONFIG"] = str(directory / "lakehouse.yaml")

    from lakehouse_assets.engine.spark import lakehouse_session
    from lakehouse_assets.lakehouse import Lakehouse

    lake = Lakehouse.from_env()
    spark = lakehouse_session(lake)
    oracle = Oracle(size)
    randomness = random.Random(size)
    started = time.perf_counter()
    for first in range(0, size, LOAD_BATCH):
        keys = range(first, min(size, first + LOAD_BATCH))
        _commit(
            spark, lake, "customers", [json.dumps({"op": "c", "id": k, "name": f"n{k}", "score": 0.0}) for k in keys]
        )
    load_seconds = time.perf_counter() - started
    figures: dict = {"rows": size, "load_seconds": load_seconds}
    for shape, newest in (("uniform", None), ("skewed", 0.1)):
        commits, end_to_end, appends = [], [], []
        for batch in range(batches):
            lines = oracle.changes(randomness, changes, newest, f"{shape}{batch}")
            result, seconds = _commit(spark, lake, "customers", lines)
            commits.append(result.commit_latency_seconds)
            end_to_end.append(seconds)
            appended, _ = _commit(spark, lake, "appends", lines)
            appends.append(appended.commit_latency_seconds)
            print(
                f"  {size:,} rows, {shape} batch {batch + 1}: commit {result.commit_latency_seconds:.2f} s "
                f"({result.kind}, +{result.inserted} ~{result.updated} -{result.deleted}), "
                f"end to end {seconds:.2f} s, append {appended.commit_latency_seconds:.2f} s",
                flush=True,
            )
        # The first batch of a shape pays for what a long-running process has already done
        # (the JIT, the key index's first read); the median of the others is reported.
        figures[shape] = {
            "commit": statistics.median(commits[1:] or commits),
            "end_to_end": statistics.median(end_to_end[1:] or end_to_end),
            "append": statistics.median(appends[1:] or appends),
        }
    figures["count_seconds"], figures["point_seconds"] = _queries(lake, oracle, randomness)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--label", default="this checkout")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="lakehouse-cdc-scale-"))

    import duckdb
    import pyspark

    print(
        f"{args.label}: machine {platform.machine()}, {os.cpu_count()} cores; Spark {pyspark.__version__} local[2], "
        f"Iceberg 1.10.2, DuckDB {duckdb.__version__}; {args.changes} net changes per batch, "
        f"median of batches 2-{args.batches}"
    )
    results = []
    for size in (int(value) for value in args.sizes.split(",")):
        figures = measure(workdir, size, args.changes, args.batches)
        results.append(figures)
        print(json.dumps(figures), flush=True)
    print("\ntable rows | load s | uniform commit s | end-to-end s | skewed commit s | append s | count s | point s")
    for figures in results:
        uniform, skewed = figures["uniform"], figures["skewed"]
        print(
            f"{figures['rows']:,} | {figures['load_seconds']:.0f} | {uniform['commit']:.2f} | "
            f"{uniform['end_to_end']:.2f} | {skewed['commit']:.2f} | {uniform['append']:.2f} | "
            f"{figures['count_seconds']:.3f} | {figures['point_seconds']:.3f}"
        )
    smallest = results[0]["uniform"]["commit"]
    for figures in results[1:]:
        print(
            f"uniform commit at {figures['rows']:,} rows / at {results[0]['rows']:,}: "
            f"{figures['uniform']['commit'] / smallest:.2f}x"
        )


if __name__ == "__main__":
    main()
