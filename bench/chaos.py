"""Chaos under ``dagster dev``: the runtime's own processes killed at random while events land, then
no operator action; every event must end in its table exactly once and no run left in progress.

    python bench/chaos.py --seed 1 --seconds 180

In a temporary directory (own ``LAKEHOUSE_HOME``, ``DAGSTER_HOME``, the project's ``dagster.yaml``)
it starts ``dagster dev`` with three streams: an append stream (``chaos.events``), a change stream
(``chaos.accounts``: inserts, updates and deletes of a key pool, committed by MERGE) and a routed
stream (``chaos.region_<region>``, one table per region), and, from a local Kafka broker it starts
(``ops/kafka_broker.py``), an append stream of a 4-partition topic (``chaos.kafka_events``) and a
Debezium change stream of a 2-partition topic (``chaos.customers``, by key in LSN order). Every
``--chunk-seconds`` it lands a chunk of each file stream (``land_events``: write, fsync, rename, as
``lakehouse ingest`` does) and produces a chunk into each topic (idempotent producer, so a retry
after a broker kill never writes a record twice; ``--no-kafka`` leaves both out). Meanwhile, at
seeded random intervals of ``--min-gap``-``--max-gap`` seconds, it SIGKILLs one process of the
runtime (or, for ``--sigterm-share`` of them, sends SIGTERM as a supervisor stopping it would): the
Spark host, the host's JVM, a run worker, or (at least once, ``--orchestrator-kills``) the whole
``dagster dev`` process group, which it then starts again as an operator's supervisor would, and
(``--broker-kills``) the Kafka broker, started again after ``--server-down`` seconds. With
``--object-store`` the whole warehouse is on a local S3-compatible store (S3Proxy) and the tables
in Iceberg's REST catalog server (``ops/s3_server.py``, ``ops/rest_catalog_server.py``), as
``docs/deploy.md`` configures them; the store (``--store-kills``) and the catalog
(``--catalog-kills``) are then SIGKILLed too, and started again after ``--server-down`` seconds. With
``--disk-fulls`` the lakehouse home is a tmpfs of ``--disk-bytes`` the benchmark mounts (root only;
the Dagster instance stays on the regular disk, as production keeps it in PostgreSQL), filled to its
last byte for ``--disk-full-seconds`` that many times; the producer lands each chunk again until the
disk takes it, as a producer retries a refused write.
After the last chunk it waits, up to ``--drain-timeout``, until DuckDB reads every table equal to
its oracle (the append ids once each; the key model of the changes applied in order; each
region's ids once each; the Kafka ids once each; the Debezium key model) and no run is queued or
in progress, then reports the kills, the drain
time after the last kill, every run left in a non-final state, and which processes of ``dagster
dev`` were still alive 30 s after the SIGTERM that stops it.

Exit code 1 when a table differs from its oracle, the drain timed out, or a run was left in progress.
The result goes to ``<tmp>/result.json`` (and ``--json-out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dagster_dev_freshness as dev  # noqa: E402 - the dagster dev harness beside this script

from lakehouse_assets.jvm.connectors import S3_COMPATIBLE_ENV  # noqa: E402
from lakehouse_assets.ops.jvm_server import JvmServer  # noqa: E402
from lakehouse_assets.ops.kafka_broker import LocalBroker  # noqa: E402
from lakehouse_assets.ops.rest_catalog_server import LocalRestCatalog  # noqa: E402
from lakehouse_assets.ops.s3_server import LocalS3Server  # noqa: E402

APPEND_STREAM, APPEND_TABLE = "chaos_events", "chaos.events"
CHANGE_STREAM, CHANGE_TABLE = "chaos_changes", "chaos.accounts"
ROUTED_STREAM, REGIONS = "chaos_routed", ("eu", "us", "ap")
KAFKA_STREAM, KAFKA_TABLE, KAFKA_TOPIC, KAFKA_PARTITIONS = "chaos_kafka", "chaos.kafka_events", "chaos-events", 4
DEBEZIUM_STREAM, DEBEZIUM_TABLE, DEBEZIUM_TOPIC, DEBEZIUM_PARTITIONS = "chaos_cdc", "chaos.customers", "chaos-cdc", 2
SERVER_KINDS = ("kafka-broker", "object-store", "rest-catalog")
KINDS = ("spark-host", "spark-jvm", "run-worker", "dagster-dev", *SERVER_KINDS, "disk-full")
FINAL_STATUSES = ("SUCCESS", "FAILURE", "CANCELED")
VICTIM_WAIT_SECONDS = 5.0
VICTIM_PATIENCE_SECONDS = 60.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="the seed of the kill schedule and the events")
    parser.add_argument("--seconds", type=float, default=180, help="how long events land and kills happen")
    parser.add_argument("--chunk-seconds", type=float, default=5, help="one chunk per stream every N seconds")
    parser.add_argument("--events", type=int, default=2000, help="append and routed events per chunk")
    parser.add_argument("--changes", type=int, default=500, help="changes per chunk")
    parser.add_argument("--keys", type=int, default=3000, help="the change stream's key pool")
    parser.add_argument("--min-gap", type=float, default=10, help="fewest seconds between kills")
    parser.add_argument("--max-gap", type=float, default=20, help="most seconds between kills")
    parser.add_argument("--orchestrator-kills", type=int, default=1, help="kills of the whole dagster dev")
    parser.add_argument(
        "--orchestrator-last",
        action="store_true",
        help="kill the whole dagster dev at the last moments instead of at random ones",
    )
    parser.add_argument(
        "--kafka", action=argparse.BooleanOptionalAction, default=True, help="the two Kafka streams and broker kills"
    )
    parser.add_argument("--broker-kills", type=int, default=1, help="SIGKILLs of the Kafka broker")
    parser.add_argument(
        "--object-store",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the warehouse on a local S3-compatible store, the tables in a REST catalog; both killed too",
    )
    parser.add_argument("--store-kills", type=int, default=1, help="SIGKILLs of the store (with --object-store)")
    parser.add_argument("--catalog-kills", type=int, default=1, help="SIGKILLs of the catalog (with --object-store)")
    parser.add_argument("--server-down", type=float, default=5, help="seconds a killed server stays down")
    parser.add_argument("--disk-fulls", type=int, default=0, help="times the home's disk is filled (root only)")
    parser.add_argument("--disk-full-seconds", type=float, default=30, help="how long each fill lasts")
    parser.add_argument("--disk-bytes", type=int, default=2 * 1024**3, help="the size of the home's tmpfs")
    parser.add_argument("--sigterm-share", type=float, default=0.25, help="share of SIGTERM among the other kills")
    parser.add_argument("--drain-timeout", type=float, default=300, help="seconds to wait after the last chunk")
    parser.add_argument("--startup-timeout", type=float, default=300, help="seconds to wait for dagster dev")
    parser.add_argument("--max-age", default="10s", help="flush.max_age of every stream")
    parser.add_argument(
        "--start-timeout",
        type=int,
        default=None,
        help="run monitoring's start timeout in seconds (default: dagster.yaml's): how long a run whose "
        "launch died with dagster dev waits before it is failed and run again",
    )
    parser.add_argument("--project-root", type=Path, default=dev.PROJECT_ROOT, help="where workspace.yaml is")
    parser.add_argument("--json-out", type=Path, default=None, help="also write the result JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the whole temporary directory")
    parser.add_argument("--work-root", type=Path, default=None, help="where the work directory goes (default: TMPDIR)")
    args = parser.parse_args(argv)
    if not 0 < args.min_gap <= args.max_gap:
        parser.error("--min-gap must be positive and at most --max-gap")
    return args


def pipeline_config(max_age: str, bootstrap_servers: str | None) -> dict[str, Any]:
    """The streams: append, change (MERGE) and routed from landing files; append and Debezium
    changes from Kafka when there is a broker."""
    common = {"auto_create": True, "commit_interval": "0s", "flush": {"max_bytes": 67108864, "max_age": max_age}}

    def kafka(topic: str, **source: Any) -> dict[str, Any]:
        return {"kafka": {"bootstrap_servers": bootstrap_servers, "topic": topic, **source}}

    file_streams = [
        {
            "name": APPEND_STREAM,
            "table_identifier": APPEND_TABLE,
            "schema": {
                "columns": [
                    {"name": "event_id", "type": "long", "required": True},
                    {"name": "amount", "type": "double"},
                    {"name": "ts", "type": "timestamptz"},
                ]
            },
            **common,
        },
        {
            "name": CHANGE_STREAM,
            "table_identifier": CHANGE_TABLE,
            "operation": "${/op}",
            "identifier_columns": ["id"],
            "schema": {
                "columns": [
                    {"name": "id", "type": "long", "required": True},
                    {"name": "balance", "type": "long"},
                    {"name": "ts", "type": "timestamptz"},
                ],
                "partition_spec": [{"column": "id", "transform": "bucket[4]"}],
            },
            "table_properties": {"format-version": "2"},
            **common,
        },
        {"name": ROUTED_STREAM, "table_identifier": "chaos.region_${/region}", **common},
    ]
    if bootstrap_servers is None:
        return {"streams": file_streams}
    kafka_streams = [
        {
            "name": KAFKA_STREAM,
            "source": kafka(KAFKA_TOPIC, metadata_columns={"kafka_offset": "offset"}),
            "table_identifier": KAFKA_TABLE,
            "schema": {
                "columns": [
                    {"name": "event_id", "type": "long", "required": True},
                    {"name": "ts", "type": "timestamptz"},
                    {"name": "kafka_offset", "type": "long"},
                ]
            },
            **common,
        },
        {
            "name": DEBEZIUM_STREAM,
            "source": kafka(DEBEZIUM_TOPIC, format="debezium"),
            "table_identifier": DEBEZIUM_TABLE,
            "identifier_columns": ["id"],
            "schema": {
                "columns": [
                    {"name": "id", "type": "long", "required": True},
                    {"name": "balance", "type": "long"},
                ]
            },
            "table_properties": {"format-version": "2"},
            **common,
        },
    ]
    return {"streams": file_streams + kafka_streams}


@dataclass
class Oracle:
    """What the tables must hold: every event and change the producer landed."""

    append_ids: int = 0
    accounts: dict[int, int] = field(default_factory=dict)
    routed: dict[str, list[int]] = field(default_factory=lambda: {region: [] for region in REGIONS})
    routed_ids: int = 0
    kafka_ids: int = 0
    customers: dict[int, int] = field(default_factory=dict)
    lsn: int = 0


class Producer(threading.Thread):
    """Lands one chunk of each file stream and produces one into each topic every
    ``--chunk-seconds`` for ``--seconds``, on a fixed schedule."""

    def __init__(self, args: argparse.Namespace, oracle: Oracle, bootstrap_servers: str | None) -> None:
        from confluent_kafka import Producer as KafkaProducer

        super().__init__(name="producer", daemon=True)
        self.args, self.oracle = args, oracle
        self.rng = random.Random(args.seed * 7919)
        self.error: BaseException | None = None
        # Idempotent, and patient enough to outlast a killed broker: a record is in the topic once.
        settings = {
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "message.timeout.ms": 600_000,
            "log_level": 2,  # not every refused connection while the broker is down
        }
        self.kafka = KafkaProducer(settings) if bootstrap_servers else None
        self.undelivered: list[str] = []
        self.refused_writes = 0

    def run(self) -> None:
        try:
            self._produce()
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            self.error = error

    def _land(self, lake: Any, stream: str, lines: list[str]) -> None:
        """Land ``lines`` (the oracle has them already), again every second while the disk refuses them."""
        from lakehouse_assets.batches.landing import land_events
        from lakehouse_assets.storage_space import REFUSING_ERRNOS

        while True:
            try:
                land_events(lake.paths, lake.stream(stream), lines)
                return
            except OSError as refused:
                if refused.errno not in REFUSING_ERRNOS:
                    raise
                self.refused_writes += 1
                time.sleep(1.0)

    def _produce(self) -> None:
        from lakehouse_assets.lakehouse import Lakehouse

        lake = Lakehouse.from_env()
        start = time.monotonic()
        for index in range(max(1, round(self.args.seconds / self.args.chunk_seconds))):
            delay = start + index * self.args.chunk_seconds - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            now = datetime.now(timezone.utc).isoformat()
            self._land(lake, APPEND_STREAM, self._appends(now))
            self._land(lake, CHANGE_STREAM, self._changes(now))
            self._land(lake, ROUTED_STREAM, self._routed(now))
            if self.kafka:
                self._produce_kafka(now)
        if self.kafka and (self.kafka.flush(self.args.drain_timeout) or self.undelivered):
            raise RuntimeError(f"Kafka records not delivered: {self.undelivered[:3] or 'still queued'}")

    def _send(self, topic: str, partition: int, value: bytes | None) -> None:
        assert self.kafka

        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                self.undelivered.append(str(error))

        while True:
            try:
                self.kafka.produce(topic, value, partition=partition, on_delivery=delivered)
                break
            except BufferError:  # the client's queue is full (the broker is down): let it send
                self.kafka.poll(0.5)
        self.kafka.poll(0)

    def _produce_kafka(self, now: str) -> None:
        first, self.oracle.kafka_ids = self.oracle.kafka_ids, self.oracle.kafka_ids + self.args.events
        for event_id in range(first, self.oracle.kafka_ids):
            value = json.dumps({"event_id": event_id, "ts": now}).encode()
            self._send(KAFKA_TOPIC, event_id % KAFKA_PARTITIONS, value)
        for _ in range(self.args.changes):
            key = self.rng.randrange(self.args.keys)
            partition = key % DEBEZIUM_PARTITIONS  # a key's changes in one partition, in their order
            before = {"id": key, "balance": self.oracle.customers.get(key)}
            if key not in self.oracle.customers:
                op, after = "c", {"id": key, "balance": self.rng.randrange(1_000_000)}
            elif self.rng.random() < 0.2:
                op, after = "d", None
            else:
                op, after = "u", {"id": key, "balance": self.rng.randrange(1_000_000)}
            self.oracle.lsn += 1
            if after is None:
                del self.oracle.customers[key]
            else:
                self.oracle.customers[key] = after["balance"]
            envelope = {
                "op": op,
                "before": None if op == "c" else before,
                "after": after,
                "source": {"lsn": self.oracle.lsn},
            }
            self._send(DEBEZIUM_TOPIC, partition, json.dumps(envelope).encode())
            if op == "d":
                self._send(DEBEZIUM_TOPIC, partition, None)  # the tombstone Debezium follows a delete with

    def _appends(self, now: str) -> list[str]:
        first, self.oracle.append_ids = self.oracle.append_ids, self.oracle.append_ids + self.args.events
        return [json.dumps({"event_id": i, "amount": i / 4, "ts": now}) for i in range(first, self.oracle.append_ids)]

    def _changes(self, now: str) -> list[str]:
        lines = []
        for _ in range(self.args.changes):
            key = self.rng.randrange(self.args.keys)
            if key not in self.oracle.accounts:
                op, balance = "c", self.rng.randrange(1_000_000)
            elif self.rng.random() < 0.2:
                op, balance = "d", None
            else:
                op, balance = "u", self.rng.randrange(1_000_000)
            if op == "d":
                del self.oracle.accounts[key]
            else:
                self.oracle.accounts[key] = balance
            lines.append(json.dumps({"op": op, "id": key, "balance": balance, "ts": now}))
        return lines

    def _routed(self, now: str) -> list[str]:
        lines = []
        for _ in range(self.args.events):
            region, event_id = self.rng.choice(REGIONS), self.oracle.routed_ids
            self.oracle.routed_ids += 1
            self.oracle.routed[region].append(event_id)
            lines.append(json.dumps({"region": region, "event_id": event_id, "ts": now}))
        return lines


def _parent(pid: int) -> int:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def victims(work: dev.Workdir, kind: str) -> list[int]:
    """Live processes of the runtime of one kind (found by their home in the environment)."""
    mine = dev.processes_with_home(work.home)
    hosts = [pid for pid in mine if "lakehouse_assets.engine.spark_host" in dev.process_command(pid)]
    if kind == "spark-host":
        return hosts
    if kind == "spark-jvm":
        return [pid for pid in mine if "SparkSubmit" in dev.process_command(pid) and _parent(pid) in hosts]
    if kind == "run-worker":  # the process holding a run's liveness lock, which names its process id
        from lakehouse_assets.runtime.run_liveness import RunProcess, liveness_label, run_process

        pids = set()
        for lock in (work.home / "state" / "runs").glob("*.lock"):
            if run_process(liveness_label(lock)) is RunProcess.ALIVE:
                with contextlib.suppress(OSError, ValueError, IndexError):
                    pids.add(int(lock.read_text().split()[0]))
        return sorted(pids & set(mine))
    raise ValueError(kind)


def find_victim(work: dev.Workdir, kinds: list[str], until: float) -> tuple[str, list[int]] | None:
    """The first of ``kinds`` with live processes, and them: the drawn kind (``kinds[0]``) is waited
    for up to ``VICTIM_WAIT_SECONDS``, then any; between runs none may be alive, so look again
    until ``until``."""
    drawn_until = time.monotonic() + VICTIM_WAIT_SECONDS
    while True:
        for kind in kinds if time.monotonic() >= drawn_until else kinds[:1]:
            if candidates := victims(work, kind):
                return kind, candidates
        if time.monotonic() >= until:
            return None
        time.sleep(0.2)


class Orchestrator:
    """``dagster dev`` as a supervisor keeps it: started, killed whole, started again."""

    def __init__(self, args: argparse.Namespace, work: dev.Workdir) -> None:
        self.args, self.work = args, work
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> dict[str, float]:
        self.port = dev.free_port()
        since = time.time()
        self.process = dev.start_dagster(self.args, self.work, self.port)
        sensor = f"{APPEND_STREAM}_landing_sensor"
        location, marks = dev.wait_until_ready(
            self.process, self.work, self.port, since, self.args.startup_timeout, sensor
        )
        self.location = location
        return marks

    def kill(self) -> int:
        assert self.process is not None
        pgid = self.process.pid
        os.killpg(pgid, signal.SIGKILL)
        self.process.wait()
        return pgid


def chaos(
    args: argparse.Namespace, orchestrator: Orchestrator, servers: dict[str, JvmServer], deadline: float
) -> list[dict[str, Any]]:
    """Kill one process of the runtime (or one of ``servers``: the broker, the store, the catalog) at
    moments ``--min-gap``-``--max-gap`` s apart until ``deadline``; a kill that waits for its victim
    moves the later ones back."""
    rng = random.Random(args.seed)
    kills: list[dict[str, Any]] = []
    moments, moment = [], time.monotonic()
    while True:
        moment += rng.uniform(args.min_gap, args.max_gap)
        if moment >= deadline:
            break
        moments.append(moment)
    count = min(args.orchestrator_kills, len(moments))
    if args.orchestrator_last:
        orchestrator_at = set(range(len(moments) - count, len(moments)))
    else:
        orchestrator_at = set(rng.sample(range(len(moments)), count))
    others = [index for index in range(len(moments)) if index not in orchestrator_at]
    server_at: dict[int, str] = {}
    wanted_kills = dict(zip(SERVER_KINDS, (args.broker_kills, args.store_kills, args.catalog_kills), strict=True))
    for kind in servers:
        free = [index for index in others if index not in server_at]
        server_at |= dict.fromkeys(rng.sample(free, min(wanted_kills[kind], len(free))), kind)
    # A disk filled in the first half of the schedule, so producers meet it too, not only the drain.
    rest = [index for index in others if index not in server_at][: max(1, len(others) // 2)]
    disk_at = set(rng.sample(rest, min(args.disk_fulls, len(rest))))
    last_kill = time.monotonic()
    for index, moment in enumerate(moments):
        # A kill that had to wait for its victim pushes the next ones back, so each kill still
        # finds the runtime recovering from the last one, not the same moment.
        time.sleep(max(0.0, moment - time.monotonic(), last_kill + args.min_gap - time.monotonic()))
        if index in orchestrator_at:
            kills.append({"at": time.time(), "kind": "dagster-dev", "pid": orchestrator.kill()})
            print(f"  kill {len(kills)}: dagster dev (whole process group); starting it again")
            orchestrator.start()
            last_kill = time.monotonic()
            continue
        if kind := server_at.get(index):
            server = servers[kind]
            assert server.process is not None
            kills.append({"at": time.time(), "kind": kind, "pid": server.process.pid, "signal": "SIGKILL"})
            print(f"  kill {len(kills)}: {server.name}; starting it again in {args.server_down:.0f} s")
            server.stop(kill=True)
            time.sleep(args.server_down)
            server.start()
            last_kill = time.monotonic()
            continue
        if index in disk_at:
            filler = orchestrator.work.home / ".chaos-filler"
            kills.append({"at": time.time(), "kind": "disk-full", "seconds": args.disk_full_seconds})
            print(f"  fault {len(kills)}: the home's disk filled for {args.disk_full_seconds:.0f} s")
            fill(filler)
            time.sleep(args.disk_full_seconds)
            filler.unlink()
            last_kill = time.monotonic()
            continue
        # Just after a kill the runtime may run no process for a while (a Spark host restarting, runs
        # waiting for it), on a busy machine for longer than the gap: wait for one, not skip the kill.
        found = find_victim(orchestrator.work, rng.sample(KINDS[:3], 3), time.monotonic() + VICTIM_PATIENCE_SECONDS)
        if found is None:
            print(f"  (no process of the runtime ran for {VICTIM_PATIENCE_SECONDS:.0f} s; kill {index + 1} skipped)")
            continue
        kind, candidates = found
        pid = rng.choice(candidates)
        # Mostly SIGKILL (a crash); now and then SIGTERM (a supervisor stopping it), which must end
        # the process cleanly and lose nothing either.
        sent = signal.SIGTERM if rng.random() < args.sigterm_share else signal.SIGKILL
        try:
            os.kill(pid, sent)
        except ProcessLookupError:
            continue
        kills.append({"at": time.time(), "kind": kind, "pid": pid, "signal": sent.name})
        last_kill = time.monotonic()
        print(f"  kill {len(kills)}: {kind} {pid} ({sent.name})")
    return kills


def fill(filler: Path) -> None:
    """Take every free byte of the file system ``filler`` is on (``posix_fallocate``)."""
    with open(filler, "ab") as handle:
        while (room := os.statvfs(filler.parent).f_bavail * os.statvfs(filler.parent).f_frsize) > 0:
            os.posix_fallocate(handle.fileno(), os.fstat(handle.fileno()).st_size, room)


def table_state(oracle: Oracle, kafka: bool) -> dict[str, Any]:
    """Every table against its oracle, read by DuckDB at its current snapshot (the Kafka streams'
    with ``kafka``)."""
    from lakehouse_assets.lakehouse import Lakehouse
    from lakehouse_assets.quality.duck import iceberg_connection, read_storage_of, scan

    lake = Lakehouse.from_env()
    read_storage_of(lake.config.catalog)
    duck = iceberg_connection()

    def rows(identifier: str, sql: str) -> list[tuple] | None:
        location = lake.metadata_location(identifier)
        table = lake.table(identifier) if location else None
        snapshot = table.current_snapshot() if table else None
        if snapshot is None:
            return None
        return duck.sql(sql.format(table=scan(location, snapshot.snapshot_id))).fetchall()

    appended = rows(
        APPEND_TABLE, "SELECT count(*), count(DISTINCT event_id), min(event_id), max(event_id) FROM {table}"
    )
    accounts = rows(CHANGE_TABLE, "SELECT id, balance FROM {table} ORDER BY id")
    state: dict[str, Any] = {
        APPEND_TABLE: appended[0] if appended else None,
        "append_ok": bool(appended) and appended[0] == (oracle.append_ids, oracle.append_ids, 0, oracle.append_ids - 1),
        CHANGE_TABLE: len(accounts) if accounts is not None else None,
        "changes_ok": accounts is not None
        and dict(accounts) == oracle.accounts
        and len(accounts) == len(oracle.accounts),
        "routed_ok": True,
    }
    for region, expected in oracle.routed.items():
        identifier = f"chaos.region_{region}"
        found = rows(identifier, "SELECT event_id FROM {table} ORDER BY event_id")
        ids = [row[0] for row in found] if found is not None else None
        state[identifier] = len(ids) if ids is not None else None
        state["routed_ok"] = state["routed_ok"] and ids == sorted(expected)
    state["ok"] = state["append_ok"] and state["changes_ok"] and state["routed_ok"]
    if not kafka:
        return state
    ids_sql = "SELECT count(*), count(DISTINCT event_id), min(event_id), max(event_id) FROM {table}"
    kafka_ids = rows(KAFKA_TABLE, ids_sql)
    state[KAFKA_TABLE] = kafka_ids[0] if kafka_ids else None
    expected_ids = (oracle.kafka_ids, oracle.kafka_ids, 0, oracle.kafka_ids - 1)
    state["kafka_ok"] = bool(kafka_ids) and kafka_ids[0] == expected_ids
    customers = rows(DEBEZIUM_TABLE, "SELECT id, balance FROM {table} ORDER BY id")
    state[DEBEZIUM_TABLE] = len(customers) if customers is not None else None
    state["debezium_ok"] = customers is not None and dict(customers) == oracle.customers
    state["debezium_ok"] = state["debezium_ok"] and len(customers or []) == len(oracle.customers)
    state["ok"] = state["ok"] and state["kafka_ok"] and state["debezium_ok"]
    return state


def runs_summary(instance: Any) -> dict[str, Any]:
    """Runs by job and status, and every run not in a final state."""
    counts: dict[str, int] = {}
    left = []
    for run in instance.get_runs():
        key = f"{run.job_name} {run.status.value}"
        counts[key] = counts.get(key, 0) + 1
        if run.status.value not in FINAL_STATUSES:
            left.append(f"{run.job_name} {run.status.value} {run.run_id}")
    return {"by_job_and_status": dict(sorted(counts.items())), "not_final": left}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = make_workdir(args)
    print(f"workdir {work.root}; seed {args.seed}")
    orchestrator = Orchestrator(args, work)
    oracle = Oracle()
    result: dict[str, Any] = {"seed": args.seed, "args": {k: str(v) for k, v in vars(args).items()}}
    servers: dict[str, JvmServer] = {}
    try:
        broker = start_broker(work) if args.kafka else None
        config = pipeline_config(args.max_age, broker.bootstrap_servers if broker else None)
        if broker:
            servers["kafka-broker"] = broker
        if args.object_store:
            store, catalog = start_object_store(work)
            servers |= {"object-store": store, "rest-catalog": catalog}
            config["catalog"] = catalog.catalog_properties()
        work.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        result["ready"] = orchestrator.start()
        producer = Producer(args, oracle, broker.bootstrap_servers if broker else None)
        started = time.monotonic()
        producer.start()
        kills = chaos(args, orchestrator, servers, started + args.seconds)
        producer.join()
        if producer.error is not None:
            raise producer.error
        last_kill = kills[-1]["at"] if kills else time.time()
        print(f"  producer done; waiting for the drain (last kill {time.time() - last_kill:.0f} s ago)")
        instance = dev.open_instance(work)
        drained_at, state = None, {}
        deadline = time.monotonic() + args.drain_timeout
        idle_looks = 0
        while time.monotonic() < deadline:
            dev.ensure_running(orchestrator.process, work)
            state = table_state(oracle, broker is not None)
            idle_looks = idle_looks + 1 if state["ok"] and not runs_summary(instance)["not_final"] else 0
            if idle_looks >= 2:  # two looks apart, so a run about to be launched is not missed
                drained_at = time.time()
                break
            time.sleep(3)
        result.update(
            kills=kills,
            kills_by_kind={kind: sum(1 for k in kills if k["kind"] == kind) for kind in KINDS},
            sigterms=sum(1 for k in kills if k.get("signal") == "SIGTERM"),
            tables=state,
            runs=runs_summary(instance),
            producer_refused_writes=producer.refused_writes,
            drained=drained_at is not None,
            drain_seconds_after_last_kill=(drained_at - last_kill) if drained_at else None,
            events={
                "append": oracle.append_ids,
                "routed": oracle.routed_ids,
                "live_keys": len(oracle.accounts),
                "kafka": oracle.kafka_ids,
                "debezium_changes": oracle.lsn,
                "debezium_live_keys": len(oracle.customers),
            },
        )
    finally:
        if orchestrator.process is not None:
            # SIGTERM to the whole dagster dev first; what was still alive 30 s later was SIGKILLed.
            # The Spark host (and its JVM) outlives dagster dev by design, until its idle timeout;
            # the servers run under this benchmark's home but are no strays of dagster dev either,
            # and stop after it, as a deployment's would stay up.
            expected = set(victims(work, "spark-host") + victims(work, "spark-jvm"))
            expected |= {server.process.pid for server in servers.values() if server.process is not None}
            result["left_after_sigterm"] = sorted(set(dev.stop_dagster(orchestrator.process, work)) - expected)
        for server in servers.values():
            server.stop()
    ok = bool(result.get("drained")) and result["tables"]["ok"] and not result["runs"]["not_final"]
    result["ok"] = ok
    print_report(result)
    text = json.dumps(result, indent=2, default=str)
    (work.root / "result.json").write_text(text)
    if args.json_out:
        args.json_out.write_text(text)
    if args.disk_fulls:  # lazily: the Spark host outlives dagster dev until its idle timeout
        subprocess.run(["umount", "-l", str(work.home)], check=True)
    if ok and not args.keep:
        dev.tidy(work, keep=False)
    return 0 if ok else 1


def start_broker(work: dev.Workdir) -> LocalBroker:
    """A local broker in the work directory with this benchmark's two topics."""
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = LocalBroker.at(work.root / "kafka")
    broker.start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    topics = [NewTopic(KAFKA_TOPIC, KAFKA_PARTITIONS, 1), NewTopic(DEBEZIUM_TOPIC, DEBEZIUM_PARTITIONS, 1)]
    for future in admin.create_topics(topics).values():
        future.result()
    return broker


def start_object_store(work: dev.Workdir) -> tuple[LocalS3Server, LocalRestCatalog]:
    """A local S3-compatible store with the bucket ``lake`` and a REST catalog whose warehouse is on
    it, in the work directory. The SDK settings a store other than AWS needs go into this process's
    environment, so ``dagster dev`` and its processes have them too (``docs/deploy.md``)."""
    os.environ.update(S3_COMPATIBLE_ENV)
    work.env.update(S3_COMPATIBLE_ENV)
    store = LocalS3Server.at(work.root / "s3")
    store.start()
    store.create_bucket("lake")
    catalog = LocalRestCatalog.at(work.root / "rest-catalog", store, "s3://lake/warehouse")
    catalog.start()
    return store, catalog


def make_workdir(args: argparse.Namespace) -> dev.Workdir:
    """Temporary homes with the project's ``dagster.yaml``; this process's environment points at
    them (it reads the tables and the instance itself)."""
    root = Path(tempfile.mkdtemp(prefix="lakehouse-chaos-", dir=args.work_root))
    work = dev.Workdir(root, root / "home", root / "dagster", root / "lakehouse.yaml", root / "dagster-dev.log", {})
    work.home.mkdir()
    if args.disk_fulls:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.disk_bytes}", "tmpfs", str(work.home)], check=True)
    work.dagster_home.mkdir()
    instance_settings = yaml.safe_load((args.project_root / "dagster.yaml").read_text())
    if args.start_timeout is not None:
        instance_settings["run_monitoring"]["start_timeout_seconds"] = args.start_timeout
    (work.dagster_home / "dagster.yaml").write_text(yaml.safe_dump(instance_settings, sort_keys=False))
    os.environ.update(
        LAKEHOUSE_HOME=str(work.home), DAGSTER_HOME=str(work.dagster_home), LAKEHOUSE_CONFIG=str(work.config_file)
    )
    work.env.update(os.environ, PATH=f"{dev.BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    return work


def print_report(result: dict[str, Any]) -> None:
    print("=== chaos under dagster dev ===")
    print(f"seed {result['seed']}; kills: {result.get('kills_by_kind')}, {result.get('sigterms')} of them SIGTERM")
    tables = result.get("tables") or {}
    print(f"tables equal to the oracle: {tables.get('ok')} ({ {k: v for k, v in tables.items() if '.' in k} })")
    after = result.get("drain_seconds_after_last_kill")
    print(f"drained: {result.get('drained')}" + (f", {after:.0f} s after the last kill" if after else ""))
    runs = result.get("runs") or {}
    print(f"runs: {runs.get('by_job_and_status')}")
    print(f"runs left in a non-final state: {runs.get('not_final') or 'none'}")
    print(f"processes still alive 30 s after SIGTERM to dagster dev: {result.get('left_after_sigterm') or 'none'}")
    print("OK" if result.get("ok") else "FAILED")


if __name__ == "__main__":
    sys.exit(main())
