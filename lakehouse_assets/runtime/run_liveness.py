"""Whether the process running a Dagster run is still alive, told by a lock the run holds.

Every run of the pipeline takes an OS lock (``flock``) on ``state/runs/<run id>.lock`` when its
resources are set up, and keeps it until its process exits (``lakehouse run`` releases it when the
run returns, since it executes many runs in one process). The OS releases the lock of a process
that was killed, however it died, so "the lock is free" means "no process runs this run any more":
unlike a process id, it cannot be mistaken for another process that got the same id. The run
records where its lock is in a run tag (host and path), which is also how a reader knows the run
took one.

Dagster's run monitoring asks the run launcher whether a run's worker is healthy, and Dagster's
default launcher cannot tell (``lakehouse_assets.runtime.run_launcher`` answers from this lock); ``lakehouse
run`` asks before it executes anything. Neither imports Spark.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from enum import Enum
from pathlib import Path

from lakehouse_assets.paths import LakehousePaths

RUN_KIND_TAG = "lakehouse/run-kind"
"""What a run does: ``writer``, ``committer``, ``maintenance``, ``freshness``, ``source`` or ``check``;
``dagster.yaml`` limits runs by it, and the run launcher judges the pipeline's runs by it."""
LIVENESS_TAG = "lakehouse/liveness-lock"
"""``<host>:<lock path>``: where the run's liveness lock is; set by the run once it holds it."""
RUNS_DIR = "runs"
STALE_LOCK_SECONDS = 86400.0
"""Lock files of runs whose process ended more than a day ago are removed when a run starts."""

_held: dict[str, int] = {}
"""This process's liveness locks: run id -> open file descriptor."""


class RunProcess(Enum):
    """What a run's liveness lock says about the process that runs it."""

    ALIVE = "alive"
    GONE = "gone"
    UNKNOWN = "unknown"
    """No lock recorded yet, or one on another host: not this process's to judge."""


def liveness_label(path: Path) -> str:
    """The tag value naming a lock file on this host."""
    return f"{socket.gethostname()}:{path}"


def hold_run_lock(paths: LakehousePaths, run_id: str) -> Path:
    """Take the liveness lock of ``run_id`` for this process (idempotent) and return its path.

    The lock is taken on a temporary name and renamed into place, so whoever finds the file finds
    it locked for as long as this process lives.
    """
    directory = paths.state / RUNS_DIR
    lock_file = directory / f"{run_id}.lock"
    if run_id in _held:
        return lock_file
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale_locks(directory)
    temporary = directory / f".{run_id}.{os.getpid()}.lock"
    descriptor = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    os.write(descriptor, f"{os.getpid()} {time.time()}\n".encode())
    os.replace(temporary, lock_file)
    _held[run_id] = descriptor
    return lock_file


def release_run_lock(run_id: str) -> None:
    """Release this process's liveness lock of ``run_id``, once its run has ended."""
    descriptor = _held.pop(run_id, None)
    if descriptor is not None:
        os.close(descriptor)


def run_process(lock_label: str | None) -> RunProcess:
    """What the liveness lock named by a run's ``LIVENESS_TAG`` says of the run's process."""
    if not lock_label:
        return RunProcess.UNKNOWN
    host, _, path = lock_label.partition(":")
    if host != socket.gethostname():
        return RunProcess.UNKNOWN
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return RunProcess.GONE  # the run had taken it, and its file is gone with its process
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return RunProcess.ALIVE
    finally:
        os.close(descriptor)  # closing releases a probe's lock at once
    return RunProcess.GONE


def _remove_stale_locks(directory: Path) -> None:
    """Remove lock files that nobody holds and that are older than ``STALE_LOCK_SECONDS``."""
    cutoff = time.time() - STALE_LOCK_SECONDS
    for lock_file in directory.glob("*.lock"):
        try:
            if lock_file.stat().st_mtime < cutoff and run_process(liveness_label(lock_file)) is RunProcess.GONE:
                lock_file.unlink()
        except FileNotFoundError:
            continue
