"""The Spark host: one warm Spark driver that the pipeline's Dagster runs share.

Under ``dagster dev`` or the Dagster daemon every run is its own process. A run that starts its
own Spark JVM pays 5-10 s for it, and its first Spark jobs run on a cold JIT (a 15,000-event batch
took 13 s to stage cold, about 1 s warm), which for micro-batches is most of a batch's freshness.
The Spark host is one long-lived Python process of the lakehouse home holding a Spark session:
runs send it an engine call (stage this batch, commit that table) over a local socket and get the
result back, so the JVM starts once and stays warm.

Spark Connect is the library's way for a Python process to drive a remote Spark; its server for
Spark 3.5 ships only through Maven, and Iceberg's runtime for Spark 4 is not on PyPI, so this
project carries this small host instead. It runs the very engine functions a run would run, with
the same table locks, fences and ancestry checks: a host killed mid-call is a process killed at
that point (what the fault suite proves safe), and the calling run starts a new host and repeats
the call. A call whose caller leaves (its run terminated, or its process killed) has its Spark jobs
cancelled and stops there, as at a crash; the next run repeats it. A call not answered within
``spark_host.call_timeout`` is taken for a hung host, which the caller kills. A host whose JVM died
exits, and one told to stop (SIGTERM) answers its calls in flight first.

A landing sensor that sees events coming starts the host without waiting for it, so the JVM starts
while the batch fills; otherwise the first run that needs it does (detached, logging to
``state/spark-host.log``). A host holds a lock from its spawn to its exit, so a run that finds one
starting waits for that one instead of starting a second. The host exits after
``spark_host.idle_timeout`` without calls. Its address is derived from the home, the
static Spark settings and the package's code, so a change of either gets a new host and the old
one idles out. Calls are authenticated with a key kept in ``state/`` (mode 0600).

This module is the calling side; the host itself is ``spark_host_server``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import cache
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.locks import exclusive_lock, lock_if_free
from lakehouse_assets.paths import LakehousePaths

START_TIMEOUT_SECONDS = 180.0
POLL_SECONDS = 0.1
KEY_FILE = "spark-host.key"
LOG_FILE = "spark-host.log"
SPAWN_LOCK_FILE = "spark-host.lock"
CODE_CHANGED_EXIT = 3
JVM_GONE_EXIT = 4
HOST_ATTEMPTS = 3
"""Hosts one engine call is tried on before its run fails: a dead host is replaced and the call repeated."""
STOP_TIMEOUT_SECONDS = 120.0
"""How long a host told to stop (SIGTERM, SIGINT) waits for its calls in flight before it exits."""
ALIVE_SUFFIX = ".alive"

logger = logging.getLogger(__name__)


class SparkHostError(LakehouseError):
    """The Spark host could not be started or reached, or died during a call."""


class HostExitedError(SparkHostError):
    """The Spark host this process started exited before it answered."""


class RemoteCallError(LakehouseError):
    """An engine call failed on the Spark host with an error that cannot travel as itself (a
    py4j error holds JVM references): its type, message and traceback. Defined here, not in the
    host's module, which runs as ``__main__``: the caller unpickles it by this module's name."""


@cache
def code_stamp() -> str:
    """What identifies the package's code as this process first saw it: its files' names, sizes
    and modification times."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(sys.executable.encode())
    for path in sorted(package.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path.relative_to(package)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def host_address(lake: Lakehouse) -> str:
    """The host's Unix socket: one per lakehouse home, static Spark settings and code version
    (kept short, under the temp directory: socket paths are limited to about 100 bytes)."""
    from lakehouse_assets.engine.spark import static_spark_conf

    identity = f"{lake.paths.home}\n{sorted(static_spark_conf(lake.config).items())}\n{code_stamp()}"
    return str(Path(tempfile.gettempdir()) / f"lakehouse-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.sock")


def authkey(paths: LakehousePaths) -> bytes:
    """The key that calls to this home's host must present, created on first use."""
    key_file = paths.state / KEY_FILE
    key_file.parent.mkdir(parents=True, exist_ok=True)
    if not key_file.exists():
        temporary = key_file.with_name(f".{KEY_FILE}.{os.getpid()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32))
        try:
            os.link(temporary, key_file)
        except FileExistsError:
            pass
        temporary.unlink()
    return key_file.read_text().strip().encode()


def _connect(address: str, key: bytes) -> Connection | None:
    try:
        return Client(address, family="AF_UNIX", authkey=key)
    except (FileNotFoundError, ConnectionError, EOFError):  # no host, or one that just died
        return None


def _alive_lock(lake: Lakehouse, address: str) -> Path:
    """The lock a host of ``address`` holds from its spawn to its exit; it holds the host's process
    id and spawn time."""
    return lake.paths.state / f"{Path(address).stem}{ALIVE_SUFFIX}"


def _host_running(lake: Lakehouse, address: str) -> bool:
    """Whether a host of ``address`` runs or is starting. The OS releases the host's lock when it
    exits, so a host that died, an exited child not reaped yet or a process id used again by
    another program does not count."""
    with lock_if_free(_alive_lock(lake, address)) as free:
        return not free


def _spawn(lake: Lakehouse, address: str) -> subprocess.Popen:
    """Start a host for ``address``, detached, logging to ``state/spark-host.log`` (spawn lock held,
    no host running). The host inherits its alive lock, taken here, so it counts from this moment."""
    Path(address).unlink(missing_ok=True)  # a host that died leaves its socket file behind
    alive = os.open(_alive_lock(lake, address), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(alive, fcntl.LOCK_EX | fcntl.LOCK_NB)
        log = open(lake.paths.state / LOG_FILE, "ab")  # noqa: SIM115 - handed to the host process
        command = [sys.executable, "-m", "lakehouse_assets.engine.spark_host_server", "--address", address]
        command += ["--idle-timeout", str(lake.config.spark_host.idle_timeout), "--code-stamp", code_stamp()]
        host = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(alive,)
        )
        log.close()
        os.ftruncate(alive, 0)
        os.write(alive, f"{host.pid} {time.time()}".encode())
    finally:
        os.close(alive)  # the host's copy keeps the lock
    return host


def _holder(alive: Path) -> int | None:
    """The process id of the host holding the alive lock ``alive``; None while its spawn is still
    writing it."""
    try:
        return int(alive.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def _last_spawned_at(lake: Lakehouse, address: str) -> float:
    try:
        return float(_alive_lock(lake, address).read_text().split()[1])
    except (FileNotFoundError, ValueError, IndexError):
        return 0.0


def start_in_background(lake: Lakehouse) -> None:
    """Start the home's host unless one runs or is starting, without waiting for it: a sensor that
    sees events coming calls this, so the JVM starts while the batch fills and its run is queued
    and launched, not after. Never waits for a lock; starts no host within the start-up time of the
    last one (one that died starting is left to the runs, which report why)."""
    address = host_address(lake)
    with lock_if_free(lake.paths.state / SPAWN_LOCK_FILE) as locked:
        if not locked or _host_running(lake, address):  # a run is starting one, or one runs
            return
        if time.time() - _last_spawned_at(lake, address) < START_TIMEOUT_SECONDS:
            return
        _spawn(lake, address)


def _connect_or_start(lake: Lakehouse) -> Connection:
    """A connection to the home's host, starting one when none runs or is starting (a host that
    died, or one that is stopping, is waited for and replaced). Raises ``HostExitedError`` when the
    host this process started exits before it answers."""
    address, key = host_address(lake), authkey(lake.paths)
    connection = _connect(address, key)
    if connection is not None:
        return connection
    with exclusive_lock(lake.paths.state / SPAWN_LOCK_FILE, timeout_seconds=START_TIMEOUT_SECONDS):
        spawned: subprocess.Popen | None = None
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            connection = _connect(address, key)
            if connection is not None:
                return connection
            code = spawned.poll() if spawned is not None else None
            if code == CODE_CHANGED_EXIT:
                raise SparkHostError("the package changed since this run started; the next run uses the new code")
            if code is not None:
                raise HostExitedError(f"the Spark host exited while starting (code {code}); see {_log_file(lake)}")
            if spawned is None and not _host_running(lake, address):
                spawned = _spawn(lake, address)
            time.sleep(POLL_SECONDS)
    raise SparkHostError(f"the Spark host did not answer within {START_TIMEOUT_SECONDS:.0f}s; see {_log_file(lake)}")


def call_on_host(lake: Lakehouse, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``function(spark, lake, *args, **kwargs)`` on the home's Spark host and return its result or
    raise its error. ``function`` is a module-level engine function; arguments and result pickle.

    A host that dies before or during the call (killed, its JVM killed, stopped) is replaced and
    the call repeated, up to ``HOST_ATTEMPTS`` hosts. That is safe because every engine call is
    idempotent: a host killed mid-call is a process killed at that point, and the repeated call
    decides from the table's ancestry and the staging ledger what is left to do (the fault suite
    kills the host at each named point and repeats the call).
    """
    for attempt in range(1, HOST_ATTEMPTS + 1):
        try:
            with _connect_or_start(lake) as connection:
                connection.send((function, lake, args, kwargs))
                if not connection.poll(lake.config.spark_host.call_timeout):
                    _kill_hung_host(lake)
                    raise SparkHostError(
                        f"the Spark host did not answer {function.__name__} within spark_host.call_timeout "
                        f"({lake.config.spark_host.call_timeout:g}s); it was killed, and the call completed or "
                        f"not, atomically, as at any crash (see {_log_file(lake)})"
                    )
                status, payload = connection.recv()
        except (EOFError, OSError, HostExitedError) as lost:
            what = f"the Spark host died during {function.__name__} ({type(lost).__name__}: {lost})"
            if attempt == HOST_ATTEMPTS:
                raise SparkHostError(
                    f"{what} on {HOST_ATTEMPTS} hosts in a row; the call completed or not, atomically, and "
                    f"the next run repeats it (see {_log_file(lake)})"
                ) from None
            logger.warning(f"{what}; repeating it on a new host (attempt {attempt + 1} of {HOST_ATTEMPTS})")
            continue
        if status == "error":
            raise payload
        return payload
    raise AssertionError("unreachable")


def _kill_hung_host(lake: Lakehouse) -> None:
    """SIGKILL the home's host, known by the alive lock it holds (so no other process's id)."""
    address = host_address(lake)
    if _host_running(lake, address) and (pid := _holder(_alive_lock(lake, address))) is not None:
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            os.kill(pid, signal.SIGKILL)


def _log_file(lake: Lakehouse) -> Path:
    return lake.paths.state / LOG_FILE


def host_pid(lake: Lakehouse) -> int | None:
    """The process id of the home's running host, or None when none answers."""
    connection = _connect(host_address(lake), authkey(lake.paths))
    if connection is None:
        return None
    with connection:
        connection.send(None)
        return connection.recv()


def stop_hosts(lake: Lakehouse, wait_seconds: float = STOP_TIMEOUT_SECONDS + 5) -> dict[int, bool]:
    """SIGTERM every Spark host of the home (the current code's, and older ones idling out), as an
    operator would: each takes no new call, answers its calls in flight and exits. Waits up to
    ``wait_seconds`` for them; returns each stopped host's process id and whether it has exited."""
    stopped: dict[int, Path] = {}
    for alive in sorted(lake.paths.state.glob(f"*{ALIVE_SUFFIX}")):
        with lock_if_free(alive) as free:
            running = not free
        if running and (pid := _holder(alive)) is not None:
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                os.kill(pid, signal.SIGTERM)
            stopped[pid] = alive
    deadline = time.monotonic() + wait_seconds
    exited = dict.fromkeys(stopped, False)
    while True:
        for pid, alive in stopped.items():
            if not exited[pid]:
                with lock_if_free(alive) as free:
                    exited[pid] = free
        if all(exited.values()) or time.monotonic() >= deadline:
            return exited
        time.sleep(POLL_SECONDS)
