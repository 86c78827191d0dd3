"""The handle on one lakehouse: its configuration, where its files live, and its catalog.

Handed to engine functions instead of the configuration and the paths separately, as PyIceberg
hands around its ``Catalog``. Build one with ``Lakehouse.from_env()`` (the Dagster resource does, at
each call: routing adds a derived stream to the configuration while a run goes on, so do not keep
one across routing). It pickles (a Spark host call carries it); the configuration's parse and the
PyIceberg catalog client are cached per process.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.table import Table

from lakehouse_assets.batches.headroom import StorageRoom, spark_scratch_dirs, storage_room
from lakehouse_assets.batches.ledger import StreamLedger
from lakehouse_assets.catalog import table_metadata
from lakehouse_assets.config.loader import load_config
from lakehouse_assets.config.spec import LakehouseConfig, StreamSpec
from lakehouse_assets.errors import TableNotFoundError
from lakehouse_assets.paths import LakehousePaths


@dataclass(frozen=True)
class Lakehouse:
    """One lakehouse as a run sees it: ``config`` (streams, catalog, Spark settings) and ``paths``
    (the home and the storage root)."""

    config: LakehouseConfig
    paths: LakehousePaths

    @classmethod
    def from_env(cls) -> Lakehouse:
        """The lakehouse of ``$LAKEHOUSE_CONFIG`` and ``$LAKEHOUSE_HOME`` (``$LAKEHOUSE_STORAGE_ROOT``)."""
        return cls(load_config(), LakehousePaths.from_env())

    def stream(self, name: str) -> StreamSpec:
        """The stream called ``name``; ConfigError when there is none."""
        return self.config.stream(name)

    def ledger(self, stream_name: str) -> StreamLedger:
        """The staging ledger of a stream (a routed table's stream included)."""
        return StreamLedger(self.paths.staging(stream_name))

    def storage_room(self) -> StorageRoom:
        """The free space of the storage root and Spark's scratch against what committing every
        stream's backlog needs."""
        scratch = spark_scratch_dirs(self.config.spark)
        return storage_room(self.paths, self.config.streams, self.config.storage.min_free_bytes, scratch)

    def source(self, stream: StreamSpec) -> Lakehouse:
        """This lakehouse as an Iceberg source stream reads its source: through the source's own
        catalog when it has one."""
        return Lakehouse(self.config.source_catalog(stream), self.paths)

    @property
    def warehouse(self) -> str | None:
        """The catalog's warehouse location (None when the catalog knows its own)."""
        return table_metadata.warehouse_location(self.config.catalog, self.paths.warehouse)

    @property
    def file_io_properties(self) -> dict[str, str]:
        """What PyIceberg reads this lakehouse's table files with (``table_metadata.file_io_properties``)."""
        return table_metadata.file_io_properties(self.config.catalog)

    def metadata_location(self, identifier: str) -> str | None:
        """The table's current metadata file, or None when the table does not exist."""
        return table_metadata.current_metadata_location(self.config.catalog, self.warehouse, identifier)

    def table(self, identifier: str) -> Table | None:
        """The table as last committed, read-only, or None when it does not exist."""
        return table_metadata.load_committed_table(self.config.catalog, self.warehouse, identifier)

    def require_table(self, identifier: str) -> Table:
        """The table as last committed; TableNotFoundError when it does not exist."""
        table = self.table(identifier)
        if table is None:
            raise TableNotFoundError(f"table {identifier} does not exist")
        return table
