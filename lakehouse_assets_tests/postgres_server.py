"""A throwaway PostgreSQL server on loopback for the catalog tests: ``initdb`` and ``pg_ctl``.

The server binaries come from the machine (Debian's ``postgresql``; ``.ci/run`` installs it). A
missing server fails the test that needs it, with what to install: it is never skipped.
PostgreSQL refuses to run as root, so under root the data directory belongs to ``postgres``.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg2

SERVER_USER = "postgres"
DEBIAN_BINARIES = "/usr/lib/postgresql/*/bin"
JDBC_DRIVER_JARS = ("/usr/share/java/postgresql.jar",)
# Jars Spark's launcher appends to a JVM's class path: the tests give their own processes' JVMs the
# JDBC driver with it (``conftest.py``).
TEST_JVM_CLASS_PATH_ENV = "SPARK_DIST_CLASSPATH"


@dataclass(frozen=True)
class PostgresServer:
    """A running server: where to reach it, as the superuser ``postgres`` (trust authentication)."""

    port: int

    def create_database(self, name: str) -> str:
        """Create database ``name``; returns its JDBC URI."""
        connection = psycopg2.connect(host="127.0.0.1", port=self.port, user=SERVER_USER, dbname="postgres")
        connection.autocommit = True
        try:
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()
        return f"jdbc:postgresql://127.0.0.1:{self.port}/{name}"

    def clone_database(self, source: str, target: str) -> None:
        """Make ``target`` a copy of ``source`` (replacing it), cutting every connection to both."""
        connection = psycopg2.connect(host="127.0.0.1", port=self.port, user=SERVER_USER, dbname="postgres")
        connection.autocommit = True
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname IN (%s, %s)", (source, target)
                )
                cursor.execute(f'DROP DATABASE IF EXISTS "{target}"')
                cursor.execute(f'CREATE DATABASE "{target}" TEMPLATE "{source}"')
        finally:
            connection.close()


def server_binary(name: str) -> str:
    """Path of a PostgreSQL server program, from PATH or Debian's versioned directory."""
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"{DEBIAN_BINARIES}/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is not installed: apt-get install postgresql (.ci/run does)")
    return found


def jdbc_driver_jar() -> str:
    """The PostgreSQL JDBC driver jar (Debian's ``libpostgresql-jdbc-java``)."""
    if (jar := jdbc_driver_class_path()) is not None:
        return jar
    raise RuntimeError("the PostgreSQL JDBC driver is not installed: apt-get install libpostgresql-jdbc-java")


def jdbc_driver_class_path() -> str | None:
    """The JDBC driver jar if this machine has it, else None."""
    return next((jar for jar in JDBC_DRIVER_JARS if Path(jar).is_file()), None)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--", *command] if os.geteuid() == 0 else command


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Start a server with its data in a new temporary directory; stop it and remove the directory on exit.

    The directory is made under the system's temporary directory, not pytest's (which only root
    may enter), so that the server's own user can reach it.
    """
    directory = Path(tempfile.mkdtemp(prefix="lakehouse-postgres-"))
    data, sockets = directory / "data", directory / "sockets"
    sockets.mkdir(parents=True)
    if os.geteuid() == 0:
        shutil.chown(directory, SERVER_USER)
        shutil.chown(sockets, SERVER_USER)
    initdb = [server_binary("initdb"), "-D", str(data), "-U", SERVER_USER, "-A", "trust", "--no-sync"]
    subprocess.run(_as_server_user(initdb), check=True, capture_output=True)
    port = _free_port()
    options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    start = [server_binary("pg_ctl"), "-D", str(data), "-o", options, "-l", str(directory / "server.log"), "-w"]
    subprocess.run(_as_server_user([*start, "start"]), check=True, capture_output=True)
    try:
        _wait_until_accepting(port)
        yield PostgresServer(port)
    finally:
        stop = [server_binary("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]
        subprocess.run(_as_server_user(stop), check=False, capture_output=True)
        shutil.rmtree(directory, ignore_errors=True)


def _wait_until_accepting(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg2.connect(host="127.0.0.1", port=port, user=SERVER_USER, dbname="postgres").close()
            return
        except psycopg2.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
