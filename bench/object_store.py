"""The same pipeline on the local disk and on an object store, side by side: the embedded Hadoop
catalog with its warehouse on the local file system, against Iceberg's REST catalog server with
the warehouse on an S3-compatible store (S3Proxy), both servers on loopback. On the store, Spark
writes the tables through Iceberg's own S3FileIO (the project's choice) and, in a third lake with
a catalog server of its own, through Hadoop's S3A file system (``HadoopFileIO``, the
``hadoop-aws`` jars), so the two are measured side by side.

One process, one warm Spark driver (local[2]) for every lake, whose rounds alternate. Each round
lands ``--orders`` appends and ``--changes`` changes, stages one batch of each and commits each
table alone (``commit_table``), timed; a loopback proxy in front of each server counts the HTTP
requests the commit sends to the catalog and the store (the catalog server's own requests to the
store are not counted). The first round of each (table creation,
JIT warm-up) is left out.

    python bench/object_store.py [--rounds 12] [--orders 5000] [--changes 1000] [--no-s3a]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from catalog_commits import STREAMS  # noqa: E402 - the same streams as the catalog benchmark

TABLES = {stream["name"]: stream["table_identifier"] for stream in STREAMS}
REQUEST_LINE_END = b" HTTP/1.1\r\n"


class CountingProxy:
    """Forwards loopback connections to ``target_port`` and counts the HTTP requests sent."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.requests = 0
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        with source, sink:
            with contextlib.suppress(OSError):  # a server stopping resets its connections
                while chunk := source.recv(65536):
                    if counted:
                        with self._lock:
                            self.requests += chunk.count(REQUEST_LINE_END)
                    sink.sendall(chunk)
            # One side closed (a server closes an idle keep-alive connection): end both at once. A
            # close alone would wait for the other direction's thread, blocked in its recv, and the
            # client would send its next request into a connection the server had left.
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)


def _lake_at(workdir: Path, catalog: dict, spark: dict[str, str]) -> dict[str, str]:
    (workdir / "dagster").mkdir(parents=True)
    (workdir / "lakehouse.yaml").write_text(yaml.safe_dump({"catalog": catalog, "spark": spark, "streams": STREAMS}))
    return {
        "LAKEHOUSE_HOME": str(workdir / "home"),
        "DAGSTER_HOME": str(workdir / "dagster"),
        "LAKEHOUSE_CONFIG": str(workdir / "lakehouse.yaml"),
    }


def _round(environment: dict[str, str], number: int, orders: int, changes: int, proxies: list[CountingProxy]) -> dict:
    """One round on the lake of ``environment``: per table, commit seconds and requests."""
    from lakehouse_assets.batches.landing import land_events
    from lakehouse_assets.engine.spark import lakehouse_session
    from lakehouse_assets.ingest.micro_batching import mint_next_batch
    from lakehouse_assets.ingest.staging import stage_batch
    from lakehouse_assets.ingest.table_commits import commit_table
    from lakehouse_assets.lakehouse import Lakehouse

    os.environ.update(environment)
    lake = Lakehouse.from_env()
    spark = lakehouse_session(lake)
    first = number * orders
    land_events(
        lake.paths, lake.stream("orders"), [json.dumps({"order_id": first + i, "amount": i / 2}) for i in range(orders)]
    )
    land_events(
        lake.paths,
        lake.stream("customers"),
        [json.dumps({"op": "u" if i % 3 else "c", "id": i, "name": f"n{number}-{i}"}) for i in range(changes)],
    )
    figures = {}
    for stream_name, table in TABLES.items():
        stream = lake.stream(stream_name)
        started = time.monotonic()
        batch, _ = mint_next_batch(lake, stream, drain=True)
        assert batch is not None
        stage_batch(spark, lake, stream, batch.sequence)
        staged = time.monotonic()
        before = sum(proxy.requests for proxy in proxies)
        outcome = commit_table(spark, lake, table, f"bench-{number}")
        committed = time.monotonic()
        assert [result.last_sequence for result in outcome.results] == [batch.sequence], outcome
        figures[table] = {
            "commit seconds": committed - staged,
            "stage and commit seconds": committed - started,
            "requests": sum(proxy.requests for proxy in proxies) - before,
            "rows": orders if stream_name == "orders" else changes,
        }
    return figures


def _through_s3a(catalog: dict[str, str], endpoint: str) -> dict[str, str]:
    """``catalog`` with Spark's FileIO Hadoop's (S3A serving ``s3://`` locations), set per catalog
    (Iceberg's ``hadoop.*`` catalog properties); PyIceberg keeps reading through its own client."""
    return catalog | {
        "io-impl": "org.apache.iceberg.hadoop.HadoopFileIO",
        "hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "hadoop.fs.s3a.endpoint": endpoint,
        "hadoop.fs.s3a.path.style.access": "true",
        "hadoop.fs.s3a.connection.ssl.enabled": "false",
        # Hadoop 3.4's default: no delete of the parent "directory" markers after every write
        # (S3Proxy left that bulk delete unanswered until its idle timeout, again and again).
        "hadoop.fs.s3a.directory.marker.retention": "keep",
        "hadoop.fs.s3a.access.key": catalog["s3.access-key-id"],
        "hadoop.fs.s3a.secret.key": catalog["s3.secret-access-key"],
    }


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--orders", type=int, default=5000)
    parser.add_argument("--changes", type=int, default=1000)
    parser.add_argument("--no-s3a", action="store_true", help="leave out the lake written through S3A")
    args = parser.parse_args()

    import pyspark

    from lakehouse_assets.jvm.connectors import HADOOP_AWS, connector_jars
    from lakehouse_assets.ops.rest_catalog_server import local_rest_catalog
    from lakehouse_assets.ops.s3_server import local_s3_server

    base = Path(tempfile.mkdtemp(prefix="lakehouse-object-store-bench-"))
    # The object store's lake first: its configuration starts the JVM, with the AWS SDK on the class path.
    lake_names = ["object store", "local"] + ([] if args.no_s3a else ["object store (S3A)"])
    results: dict[str, dict[str, dict[str, list[float]]]] = {name: {} for name in lake_names}
    # One JVM serves every lake: S3A's jars go on its class path whichever lake starts it.
    spark = {} if args.no_s3a else {"spark.driver.extraClassPath": os.pathsep.join(connector_jars(HADOOP_AWS))}
    with contextlib.ExitStack() as servers:
        store = servers.enter_context(local_s3_server(base / "s3"))
        store.create_bucket("lake")
        s3_proxy = CountingProxy(store.port)
        store_through_proxy = {"s3.endpoint": f"http://127.0.0.1:{s3_proxy.port}"}
        lakes = {}
        for name in lake_names:
            if name == "local":
                lakes[name] = (_lake_at(base / "local", {"type": "hadoop"}, spark), [])
                continue
            directory = "s3a" if name.endswith("(S3A)") else "remote"
            catalog = servers.enter_context(
                local_rest_catalog(base / f"rest-{directory}", store, f"s3://lake/{directory}")
            )
            rest_proxy = CountingProxy(catalog.port)
            remote = catalog.catalog_properties() | store_through_proxy | {"uri": f"http://127.0.0.1:{rest_proxy.port}"}
            if directory == "s3a":
                remote = _through_s3a(remote, store_through_proxy["s3.endpoint"])
            lakes[name] = (_lake_at(base / directory, remote, spark), [s3_proxy, rest_proxy])
        for number in range(args.rounds):
            for name, (environment, proxies) in lakes.items():
                figures = _round(environment, number, args.orders, args.changes, proxies)
                if number == 0:
                    continue
                for table, values in figures.items():
                    for key, value in values.items():
                        results[name].setdefault(table, {}).setdefault(key, []).append(value)

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; Spark {pyspark.__version__} local[2]; "
        f"{args.orders} appends and {args.changes} changes per round, {args.rounds - 1} rounds measured"
    )
    print("lake | table | commit s p50 | p95 | stage+commit events/s | HTTP requests per commit")
    for name, tables in results.items():
        for table, figures in tables.items():
            commit = figures["commit seconds"]
            rate = sum(figures["rows"]) / sum(figures["stage and commit seconds"])
            requests = statistics.median(figures["requests"])
            print(
                f"{name:18} | {table:13} | {statistics.median(commit):6.3f} | {_percentile(commit, 0.95):6.3f} "
                f"| {rate:8.0f} | {requests:5.0f}"
            )
    pairs = [("object store", "local")] + ([] if args.no_s3a else [("object store (S3A)", "object store")])
    for measured, baseline in pairs:
        for table in TABLES.values():
            ours, theirs = (results[name][table]["commit seconds"] for name in (measured, baseline))
            p50 = statistics.median(ours) / statistics.median(theirs)
            p95 = _percentile(ours, 0.95) / _percentile(theirs, 0.95)
            print(f"{table}: {measured} / {baseline} commit p50 {p50:.2f}x, p95 {p95:.2f}x")


if __name__ == "__main__":
    main()
