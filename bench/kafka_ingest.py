"""The seed's scenario: JSON ticks from a 32-partition Kafka topic into Iceberg, under ``dagster dev``,
side by side with what a user would pick instead: a bare Spark Structured Streaming job.

    python bench/kafka_ingest.py --rate 20000 --seconds 120

A local broker (``ops/kafka_broker.py``) gets one topic per contender. Each contender in turn is
offered the same load: a producer thread sends ``--rate`` ticks a second for ``--seconds``, each
stamped with its produce time (``ts``, epoch milliseconds), then the contender drains.

- ``lakehouse``: ``dagster dev`` on a temporary home with one Kafka stream (``flush.max_age`` =
  ``--trigger``), its landing sensor cutting offset ranges, writer runs staging and committing.
- ``structured-streaming``: ``readStream.format("kafka")`` -> ``from_json`` ->
  ``writeStream.format("iceberg")`` with ``trigger(processingTime=--trigger)`` and its own
  checkpoint, in one ``spark-submit``-like Python process on the same Spark settings.

Freshness is read from each table's metadata afterwards, not sampled: for every snapshot in the
snapshot log (the time it became visible) the data files it added, with their ``ts`` bounds and
record counts; the records of a file are taken as produced evenly between its bounds, and each
one's freshness is visible time minus produce time. Reported per contender: records committed
(checked against the produced count), sustained throughput (records over the time from the first
produce to the last commit), freshness p50/p95/max overall and in the first and last third of the
run (flat or growing), commits, and data files per commit. Ratios are lakehouse / structured
streaming. Exit code 1 when a contender lost or duplicated records.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from dagster_dev_freshness import (
    PROJECT_ROOT,
    Workdir,
    free_port,
    open_instance,
    runs_in_progress,
    start_dagster,
    stop_dagster,
    versions,
    wait_until_ready,
)

TOPIC_PARTITIONS = 32
SYMBOLS = ("AAPL", "MSFT", "NVDA", "AMZN", "GOOG", "META", "TSLA", "ORCL")
STREAM = "ticks"
TABLE = "market.ticks"
SS_TABLE = "market.ss_ticks"
TICK_COLUMNS = [
    {"name": "symbol", "type": "string", "required": True},
    {"name": "price", "type": "double"},
    {"name": "size", "type": "long"},
    {"name": "ts", "type": "timestamptz"},
]
TS_FIELD = "ts"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=20_000, help="ticks per second offered (default 20000)")
    parser.add_argument("--seconds", type=float, default=120, help="how long to produce (default 120)")
    parser.add_argument("--trigger", type=float, default=10, help="flush.max_age / processingTime, s (default 10)")
    parser.add_argument("--drain-timeout", type=float, default=300)
    parser.add_argument("--only", choices=("lakehouse", "structured-streaming"), default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    return parser.parse_args(argv)


class TickProducer(threading.Thread):
    """Sends ``rate`` ticks a second to ``topic`` for ``seconds``, keyed by symbol and a spread, each
    stamped with its produce time; counts what the broker acknowledged."""

    def __init__(self, bootstrap: str, topic: str, rate: int, seconds: float) -> None:
        super().__init__(name=f"producer-{topic}", daemon=True)
        from confluent_kafka import Producer

        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4", "batch.num.messages": 10000}
        )
        self.topic, self.rate, self.seconds = topic, rate, seconds
        self.sent = self.failed = 0
        self.started_at = self.ended_at = 0.0

    def _delivered(self, error: Any, _message: Any) -> None:
        if error is not None:
            self.failed += 1

    def run(self) -> None:
        rng = random.Random(7)
        keys = [f"{symbol}-{spread}".encode() for symbol in SYMBOLS for spread in range(16)]
        step = 0.01
        per_step = self.rate * step
        self.started_at = time.time()
        due = 0.0
        while (now := time.time()) < self.started_at + self.seconds:
            due += per_step
            stamp = int(now * 1000)
            while due >= 1:
                symbol = SYMBOLS[self.sent % len(SYMBOLS)]
                value = (
                    f'{{"symbol":"{symbol}","price":{rng.uniform(10, 900):.2f},"size":{self.sent % 500},'
                    f'"{TS_FIELD}":{stamp}}}'
                ).encode()
                while True:
                    try:
                        self.producer.produce(
                            self.topic, value, key=keys[self.sent % len(keys)], on_delivery=self._delivered
                        )
                        break
                    except BufferError:
                        self.producer.poll(0.05)
                self.sent += 1
                due -= 1
            self.producer.poll(0)
            time.sleep(max(0.0, self.started_at + (self.sent / self.rate) - time.time()))
        self.producer.flush(60)
        self.ended_at = time.time()


def _lakehouse_config(bootstrap: str, topic: str, trigger: float) -> dict[str, Any]:
    return {
        "streams": [
            {
                "name": STREAM,
                "source": {"kafka": {"bootstrap_servers": bootstrap, "topic": topic}},
                "table_identifier": TABLE,
                "auto_create": True,
                "schema": {"columns": TICK_COLUMNS},
                "table_properties": {"format-version": "2"},
                "flush": {"max_age": f"{trigger:g}s"},
                "commit_interval": "0s",
                "maintenance": {"schedule": None},
            }
        ]
    }


def _workdir(root: Path, config: dict[str, Any]) -> Workdir:
    home, dagster_home = root / "home", root / "dagster"
    home.mkdir(parents=True)
    dagster_home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", dagster_home / "dagster.yaml")
    config_file = root / "lakehouse.yaml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    settings = {"LAKEHOUSE_HOME": str(home), "DAGSTER_HOME": str(dagster_home), "LAKEHOUSE_CONFIG": str(config_file)}
    os.environ.update(settings)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return Workdir(root, home, dagster_home, config_file, root / "dagster-dev.log", env)


def _committed_records(identifier: str) -> int:
    from lakehouse_assets.lakehouse import Lakehouse

    table = Lakehouse.from_env().table(identifier)
    snapshot = table.current_snapshot() if table else None
    return int(snapshot.summary["total-records"] or 0) if snapshot and snapshot.summary else 0


def _wait_for(identifier: str, expected: int, timeout: float, busy: Any = None) -> float | None:
    """Seconds until ``expected`` records are committed (and ``busy()`` is false), None on timeout."""
    started = time.monotonic()
    while time.monotonic() < started + timeout:
        if _committed_records(identifier) >= expected and not (busy and busy()):
            return time.monotonic() - started
        time.sleep(1)
    return None


def run_lakehouse(args: argparse.Namespace, bootstrap: str, topic: str, root: Path) -> dict[str, Any]:
    work = _workdir(root, _lakehouse_config(bootstrap, topic, args.trigger))
    port = free_port()
    process = start_dagster(argparse.Namespace(project_root=PROJECT_ROOT), work, port)
    try:
        wait_until_ready(process, work, port, time.time(), 300, sensor=f"{STREAM}_landing_sensor")
        producer = TickProducer(bootstrap, topic, args.rate, args.seconds)
        producer.start()
        producer.join()
        instance = open_instance(work)
        drained = _wait_for(TABLE, producer.sent, args.drain_timeout, lambda: runs_in_progress(instance))
    finally:
        stop_dagster(process, work)
    return _measure(TABLE, producer, drained)


STRUCTURED_STREAMING_JOB = textwrap.dedent(
    """
    import sys
    from pyspark.sql import functions as F, types as T
    from lakehouse_assets.engine.spark import lakehouse_session
    from lakehouse_assets.lakehouse import Lakehouse
    from lakehouse_assets.source.kafka_log import spark_options

    bootstrap_topic, checkpoint, trigger, table = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    lake = Lakehouse.from_env()
    spark = lakehouse_session(lake)
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.market")
    spark.sql(f"CREATE TABLE IF NOT EXISTS lake.{table} (symbol string, price double, size bigint, ts timestamp) "
              "USING iceberg TBLPROPERTIES ('format-version'='2')")
    schema = T.StructType([T.StructField("symbol", T.StringType()), T.StructField("price", T.DoubleType()),
                           T.StructField("size", T.LongType()), T.StructField("ts", T.LongType())])
    stream = lake.config.streams[0]
    ticks = (spark.readStream.format("kafka").options(**spark_options(stream)).option("subscribe", bootstrap_topic)
             .option("startingOffsets", "earliest").load()
             .select(F.from_json(F.col("value").cast("string"), schema).alias("t"))
             .select("t.symbol", "t.price", "t.size", F.timestamp_millis("t.ts").alias("ts")))
    query = (ticks.writeStream.format("iceberg").outputMode("append").option("checkpointLocation", checkpoint)
             .trigger(processingTime=f"{trigger} seconds").toTable(f"lake.{table}"))
    query.awaitTermination()
    """
)


def run_structured_streaming(args: argparse.Namespace, bootstrap: str, topic: str, root: Path) -> dict[str, Any]:
    _workdir(root, _lakehouse_config(bootstrap, topic, args.trigger))
    script = root / "structured_streaming.py"
    script.write_text(STRUCTURED_STREAMING_JOB)
    command = [sys.executable, str(script), topic, str(root / "checkpoint"), f"{args.trigger:g}", SS_TABLE]
    with open(root / "structured-streaming.log", "wb") as log:
        job = subprocess.Popen(command, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
    try:
        # The job's first trigger makes the table: start producing once the query runs.
        deadline = time.monotonic() + 120
        from lakehouse_assets.lakehouse import Lakehouse

        while Lakehouse.from_env().table(SS_TABLE) is None:
            if job.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Structured Streaming job did not start; see {root / 'structured-streaming.log'}"
                )
            time.sleep(0.5)
        producer = TickProducer(bootstrap, topic, args.rate, args.seconds)
        producer.start()
        producer.join()
        drained = _wait_for(SS_TABLE, producer.sent, args.drain_timeout)
    finally:
        job.terminate()
        job.wait(timeout=60)
    return _measure(SS_TABLE, producer, drained)


def _micros(bound: bytes) -> float:
    return struct.unpack("<q", bound)[0] / 1e6


def _measure(identifier: str, producer: TickProducer, drained: float | None) -> dict[str, Any]:
    """Freshness, throughput and files per commit from the table's metadata (see the docstring)."""
    from lakehouse_assets.lakehouse import Lakehouse

    table = Lakehouse.from_env().require_table(identifier)
    field_id = table.schema().find_field(TS_FIELD).field_id
    seen: set[str] = set()
    samples: list[tuple[float, float, int]] = []  # (produce time, freshness, records)
    files_per_commit: list[int] = []
    last_visible = producer.started_at
    for entry in table.metadata.snapshot_log:
        visible = entry.timestamp_ms / 1000
        files = [task.file for task in table.scan(snapshot_id=entry.snapshot_id).plan_files()]
        added = [data for data in files if data.file_path not in seen]
        seen.update(data.file_path for data in files)
        if not added:
            continue
        files_per_commit.append(len(added))
        last_visible = max(last_visible, visible)
        for data in added:
            low, high = _micros(data.lower_bounds[field_id]), _micros(data.upper_bounds[field_id])
            points = min(int(data.record_count), 50)
            for index in range(points):
                produced = low + (high - low) * (index + 0.5) / points
                samples.append((produced, visible - produced, max(1, int(data.record_count) // points)))
    committed = _committed_records(identifier)
    samples.sort()
    third = len(samples) // 3
    return {
        "produced": producer.sent,
        "producer_failures": producer.failed,
        "offered_rate": round(producer.sent / max(producer.ended_at - producer.started_at, 1e-9)),
        "committed": committed,
        "exactly_once": committed == producer.sent and producer.failed == 0,
        "drained_after_s": drained,
        "throughput": round(committed / max(last_visible - producer.started_at, 1e-9)),
        "freshness": _percentiles(samples),
        "freshness_first_third": _percentiles(samples[:third]),
        "freshness_last_third": _percentiles(samples[-third:] if third else []),
        "commits": len(files_per_commit),
        "data_files_per_commit": round(statistics.mean(files_per_commit), 1) if files_per_commit else 0,
    }


def _percentiles(samples: list[tuple[float, float, int]]) -> dict[str, float]:
    """p50, p95 and max of the freshness of ``samples``, each weighted by its records."""
    if not samples:
        return {}
    ordered = sorted((latency, weight) for _, latency, weight in samples)
    total = sum(weight for _, weight in ordered)

    def rank(percent: float) -> float:
        reached = 0
        for latency, weight in ordered:
            reached += weight
            if reached >= total * percent / 100:
                return round(latency, 1)
        return round(ordered[-1][0], 1)

    return {"p50": rank(50), "p95": rank(95), "max": round(ordered[-1][0], 1)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from confluent_kafka.admin import AdminClient, NewTopic

    from lakehouse_assets.ops.kafka_broker import local_broker

    root = Path(tempfile.mkdtemp(prefix="lakehouse-kafka-bench-"))
    results: dict[str, Any] = {"versions": versions(), "args": {k: str(v) for k, v in vars(args).items()}}
    contenders = [("lakehouse", run_lakehouse), ("structured-streaming", run_structured_streaming)]
    with local_broker(root / "broker") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        for name, run in contenders:
            if args.only and name != args.only:
                continue
            topic = f"ticks-{name}"
            admin.create_topics([NewTopic(topic, TOPIC_PARTITIONS, 1)])[topic].result()
            print(f"{name}: offering {args.rate}/s for {args.seconds:g} s into {topic} ({TOPIC_PARTITIONS} partitions)")
            results[name] = run(args, broker.bootstrap_servers, topic, root / name)
            print(json.dumps(results[name], indent=2))
    if "lakehouse" in results and "structured-streaming" in results:
        ours, theirs = results["lakehouse"], results["structured-streaming"]
        ratios = {
            "throughput": round(ours["throughput"] / max(theirs["throughput"], 1), 2),
            "freshness_p95": round(ours["freshness"]["p95"] / max(theirs["freshness"]["p95"], 1e-9), 2),
            "data_files_per_commit": round(
                ours["data_files_per_commit"] / max(theirs["data_files_per_commit"], 1e-9), 2
            ),
        }
        results["ratios_lakehouse_over_structured_streaming"] = ratios
        print("ratios (lakehouse / structured streaming):", json.dumps(ratios))
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2))
    shutil.rmtree(root, ignore_errors=True)
    return 0 if all(r.get("exactly_once", True) for r in results.values() if isinstance(r, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
