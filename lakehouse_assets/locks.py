"""Inter-process locks held around minting batches and around every commit to a table.

The Hadoop catalog commits by renaming ``vN.metadata.json`` into place, which is not atomic against
another process on a local file system, so every process that commits to a table holds that table's
lock; it is an OS lock (``flock``) and is released if the holder is killed.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lakehouse_assets.errors import LakehouseError

POLL_SECONDS = 0.05


@contextmanager
def exclusive_lock(lock_file: Path, timeout_seconds: float = 600.0) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_file``; raises LakehouseError after the timeout."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_seconds
    with open(lock_file, "a+") as handle:
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LakehouseError(
                        f"timed out after {timeout_seconds:.0f}s waiting for lock {lock_file}"
                    ) from None
                time.sleep(POLL_SECONDS)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextmanager
def lock_if_free(lock_file: Path) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``lock_file`` if no one holds it; yields whether it is held."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            locked = False
        try:
            yield locked
        finally:
            if locked:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def table_lock_file(locks_dir: Path, table_identifier: str) -> Path:
    return locks_dir / f"table-{table_identifier}.lock"


def stream_lock_file(locks_dir: Path, stream: str) -> Path:
    return locks_dir / f"stream-{stream}.lock"


def replay_lock_file(locks_dir: Path, stream: str) -> Path:
    """Held by a dead-letter replay of ``stream`` from choosing dead letters until they are landed."""
    return locks_dir / f"replay-{stream}.lock"
