"""``lakehouse demo --kafka``: the seed's scenario on this machine. A local Kafka broker (from
Maven's jars) gets a 32-partition topic of JSON price ticks; the pipeline reads it by offset range
until idle, and DuckDB reads the table and the offsets its last commit recorded."""

from __future__ import annotations

import json
import os
import random
import time
from datetime import datetime, timezone

import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from lakehouse_assets.commit.recovery import table_history
from lakehouse_assets.config.loader import CONFIG_ENV
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.ops.kafka_broker import local_broker
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.quality.duck import iceberg_connection, scan, single_count
from lakehouse_assets.runner import dagster_instance, run_until_idle

TOPIC = "ticks"
PARTITIONS = 32
SYMBOLS = ("AAPL", "MSFT", "NVDA", "AMZN", "GOOG", "META", "TSLA", "ORCL")
DEMO_SEED = 7


def demo_config(bootstrap_servers: str) -> dict:
    """The demo's pipeline: the ticks topic into ``market.ticks``, partitions and offsets kept."""
    return {
        "catalog": {"type": "hadoop"},
        "streams": [
            {
                "name": "ticks",
                "source": {
                    "kafka": {
                        "bootstrap_servers": bootstrap_servers,
                        "topic": TOPIC,
                        "metadata_columns": {"kafka_partition": "partition", "kafka_offset": "offset"},
                    }
                },
                "table_identifier": "market.ticks",
                "auto_create": True,
                "schema": {
                    "columns": [
                        {"name": "symbol", "type": "string", "required": True},
                        {"name": "price", "type": "double"},
                        {"name": "size", "type": "long"},
                        {"name": "ts", "type": "timestamptz"},
                        {"name": "kafka_partition", "type": "int"},
                        {"name": "kafka_offset", "type": "long"},
                    ],
                    "partition_spec": [{"column": "ts", "transform": "day"}],
                },
                "flush": {"max_age": "5s"},
                "commit_interval": "0s",
            }
        ],
    }


def produce_ticks(bootstrap_servers: str, count: int) -> None:
    """``count`` JSON ticks keyed by symbol (a symbol's ticks share a partition), then one that is
    not JSON, a dead letter."""
    rng = random.Random(DEMO_SEED)
    producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 20, "compression.type": "lz4"})
    now = datetime.now(timezone.utc).timestamp()
    for index in range(count):
        symbol = rng.choice(SYMBOLS)
        tick = {"symbol": symbol, "price": round(rng.uniform(10, 900), 2), "size": rng.randint(1, 500)}
        tick["ts"] = datetime.fromtimestamp(now - (count - index) / 1000, timezone.utc).isoformat()
        value, key = json.dumps(tick).encode(), f"{symbol}-{index % PARTITIONS}".encode()
        while True:
            try:
                producer.produce(TOPIC, value, key=key)
                break
            except BufferError:  # the client's queue is full: let it send
                producer.poll(0.1)
        producer.poll(0)
    producer.produce(TOPIC, b"a tick that is not JSON", partition=0)
    producer.flush(60)


def run_kafka_demo(records: int) -> int:
    """Start a local broker, produce ``records`` ticks into a 32-partition topic, run the pipeline
    on it until idle and print what DuckDB reads."""
    paths = LakehousePaths.from_env()
    with local_broker(paths.home / "kafka-broker") as broker:
        print(f"Kafka broker (KRaft, one node) on {broker.bootstrap_servers}, its log in {broker.directory}")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        if TOPIC not in admin.list_topics(timeout=10).topics:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result()
        started = time.monotonic()
        produce_ticks(broker.bootstrap_servers, records)
        took = time.monotonic() - started
        print(f"produced {records + 1} records into {TOPIC} ({PARTITIONS} partitions) in {took:.1f}s")
        config_path = paths.home / "kafka-demo.yaml"
        config_path.write_text(yaml.safe_dump(demo_config(broker.bootstrap_servers), sort_keys=False))
        os.environ[CONFIG_ENV] = str(config_path)
        lake = Lakehouse.from_env()
        with dagster_instance(lake.paths) as instance:
            report = run_until_idle(build_definitions(lake.config), instance)
        table = lake.table("market.ticks")
        snapshot = table.current_snapshot() if table else None
        location = lake.metadata_location("market.ticks")
        if snapshot is None or location is None:
            print("market.ticks has no commit: see the failed runs above")
            return 1
        count = single_count(iceberg_connection(), f"SELECT count(*) FROM {scan(location, snapshot.snapshot_id)}")
        offsets = table_history(table).kafka_offsets("ticks")
        print(f"DuckDB reads {count} rows from market.ticks at snapshot {snapshot.snapshot_id}")
        first = offsets.get(f"{TOPIC}/0")
        print(f"its commit records the offsets reached in {len(offsets)} partitions ({TOPIC}/0: {first})")
        print(f"{len(report.succeeded)} runs succeeded, {len(report.failed)} failed")
        query = "SELECT symbol, count(*) FROM market.ticks GROUP BY 1"
        print(f'Query it: LAKEHOUSE_HOME={paths.home} LAKEHOUSE_CONFIG={config_path} lakehouse sql "{query}"')
    return 1 if report.failed else 0
