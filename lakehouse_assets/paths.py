"""Where things live under ``$LAKEHOUSE_HOME``: warehouse, landing zone, staging and local state."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lakehouse_assets.errors import ConfigError

HOME_ENV = "LAKEHOUSE_HOME"
STORAGE_ROOT_ENV = "LAKEHOUSE_STORAGE_ROOT"
DEFAULT_HOME = ".lakehouse"
DAGSTER_HOME_ENV = "DAGSTER_HOME"


@dataclass(frozen=True)
class LakehousePaths:
    """The directory layout of one lakehouse home and the storage it shares.

    The storage root holds what every host and Spark executor must see (warehouse, landing zone,
    staging ledger, routed files): ``LAKEHOUSE_STORAGE_ROOT``, a directory mounted at the same path
    everywhere, or the home itself on one machine. The home holds what is local to one host:
    ``state/`` (only what may be lost: locks, caches) and Dagster's instance.
    """

    home: Path
    storage: Path

    @classmethod
    def from_env(cls) -> LakehousePaths:
        home = Path(os.environ.get(HOME_ENV, DEFAULT_HOME)).resolve()
        storage = os.environ.get(STORAGE_ROOT_ENV)
        return cls(home, _mounted_path(storage) if storage else home)

    @property
    def warehouse(self) -> Path:
        return self.storage / "warehouse"

    def landing(self, stream: str) -> Path:
        return self.storage / "landing" / stream

    def staging(self, stream: str) -> Path:
        return self.storage / "staging" / stream

    @property
    def routes(self) -> Path:
        """Events routed by dynamic ``table_identifier`` streams: ``routes/<stream>/<table>/``."""
        return self.storage / "routes"

    def key_index(self, table_identifier: str) -> Path:
        """The key index of a change table (``commit/key_index.py``): derived from the table."""
        return self.storage / "key_index" / table_identifier

    def exports(self, stream: str) -> Path:
        """Search-index bulk files of an Iceberg source stream."""
        return self.storage / "exports" / stream

    def http(self, stream: str) -> Path:
        """What ``lakehouse serve`` keeps for a stream: its Idempotency-Key journal."""
        return self.storage / "http" / stream

    @property
    def http_server_lock(self) -> Path:
        """Held by the one ``lakehouse serve`` of this storage root."""
        return self.storage / "http" / "serve.lock"

    @property
    def state(self) -> Path:
        """Local state that may be lost: locks, the Spark host's key and log."""
        return self.home / "state"

    @property
    def locks(self) -> Path:
        return self.state / "locks"

    @property
    def dagster_home(self) -> Path:
        return self.home / "dagster"

    def written_directories(self) -> list[Path]:
        """Where the lakehouse writes: the storage root, the home, the Dagster instance
        (``$DAGSTER_HOME``) and the temporary directory, Spark's scratch."""
        dagster = Path(os.environ.get(DAGSTER_HOME_ENV, self.dagster_home))
        return [self.storage, self.home, dagster, Path(tempfile.gettempdir())]


def _mounted_path(root: str) -> Path:
    """The storage root as a local path: a path or a ``file://`` URI. Another scheme is refused:
    the staging ledger decides a batch with an exclusive hard link and landing files appear by an
    atomic rename, which an object store's API does not offer, so an object store is mounted."""
    scheme, separator, rest = root.partition("://")
    if not separator:
        return Path(root).resolve()
    if scheme != "file":
        raise ConfigError(
            f"{STORAGE_ROOT_ENV}={root!r}: the storage root must be a file system every host mounts "
            "(a path or file:// URI); mount an object store (s3fs, gcsfuse, blobfuse) and give its path"
        )
    return Path(rest).resolve()
