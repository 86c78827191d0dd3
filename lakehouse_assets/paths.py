"""Where things live under ``$LAKEHOUSE_HOME``: warehouse, landing zone, staging and local state."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "LAKEHOUSE_HOME"
DEFAULT_HOME = ".lakehouse"


@dataclass(frozen=True)
class LakehousePaths:
    """The directory layout of one lakehouse home.

    ``state/`` holds only what may be lost (locks, caches); the table and the staging ledger are
    the records that matter.
    """

    home: Path

    @classmethod
    def from_env(cls) -> LakehousePaths:
        return cls(Path(os.environ.get(HOME_ENV, DEFAULT_HOME)).resolve())

    @property
    def warehouse(self) -> Path:
        return self.home / "warehouse"

    def landing(self, stream: str) -> Path:
        return self.home / "landing" / stream

    def staging(self, stream: str) -> Path:
        return self.home / "staging" / stream

    @property
    def routes(self) -> Path:
        """Events routed by dynamic ``table_identifier`` streams: ``routes/<stream>/<table>/``."""
        return self.home / "routes"

    def exports(self, stream: str) -> Path:
        """Search-index bulk files of an Iceberg source stream."""
        return self.home / "exports" / stream

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
