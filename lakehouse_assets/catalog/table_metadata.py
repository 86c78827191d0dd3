"""Name a table for Spark, and read its committed metadata without a JVM (PyIceberg), whatever the catalog.

This is the one place that knows the Hadoop catalog's layout
(``<warehouse>/<namespace>/<table>/metadata/vN.metadata.json`` named by ``version-hint.text``);
every other catalog is asked through PyIceberg's own catalog client. The functions take the
config's ``catalog`` properties and the warehouse; engine code asks the ``Lakehouse`` handle.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.noop import NoopCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import StaticTable, Table

from lakehouse_assets.catalog.catalogs import HADOOP, WAREHOUSE_TYPES, catalog_type, pyiceberg_catalog_properties

CATALOG_NAME = "lake"
VERSION_HINT = "version-hint.text"
_METADATA_VERSION = re.compile(r"v([0-9]+)\.metadata\.json")


def qualified_name(identifier: str, branch: str | None = None) -> str:
    """The table's name in Spark; with a branch other than main, the name that reads and writes it."""
    branch_suffix = f".branch_{branch}" if branch and branch != "main" else ""
    return f"{CATALOG_NAME}.{identifier}{branch_suffix}"


def is_hadoop_catalog(catalog: Mapping[str, str]) -> bool:
    """Whether the ``catalog`` properties name Iceberg's Hadoop catalog (tables found by path)."""
    return catalog_type(catalog) == HADOOP


def warehouse_location(catalog: Mapping[str, str], default: Path) -> str | None:
    """The catalog's warehouse: the configured one, else ``default`` (``warehouse/`` under the
    storage root) for the catalogs that need one from us (hadoop, jdbc), else None (a REST or Glue
    catalog knows its own)."""
    if "warehouse" in catalog:
        return catalog["warehouse"]
    return str(default) if catalog_type(catalog) in WAREHOUSE_TYPES else None


@cache
def _catalog_client(properties: tuple[tuple[str, str], ...]) -> Catalog:
    """One PyIceberg client per catalog and process (an SQL catalog holds a connection pool)."""
    return load_catalog(CATALOG_NAME, **dict(properties))


def catalog_client(catalog: Mapping[str, str], warehouse: str | None) -> Catalog:
    """PyIceberg's client of catalog ``lake`` (not for the hadoop catalog, which has none)."""
    properties = pyiceberg_catalog_properties(catalog)
    if warehouse:
        properties["warehouse"] = warehouse
    return _catalog_client(tuple(sorted(properties.items())))


def file_io_properties(catalog: Mapping[str, str]) -> dict[str, str]:
    """The properties PyIceberg reads a table's files with: the catalog's (on S3, its endpoint
    and credentials, ``${env:}`` references read); none for the hadoop catalog's local files."""
    return {} if is_hadoop_catalog(catalog) else pyiceberg_catalog_properties(catalog)


def _hadoop_table_dir(warehouse: str | None, identifier: str) -> Path:
    return Path(str(warehouse).removeprefix("file://"), *identifier.split("."))


def _hinted_version(metadata_dir: Path) -> int | None:
    """The version ``version-hint.text`` names, or None when it is missing or unreadable."""
    try:
        return int((metadata_dir / VERSION_HINT).read_text().strip())
    except (OSError, ValueError):
        return None


def _highest_listed_version(metadata_dir: Path) -> int | None:
    """The highest ``v<N>.metadata.json`` in the directory, or None when there is none."""
    try:
        names = [entry.name for entry in metadata_dir.iterdir()]
    except FileNotFoundError:
        return None
    versions = [int(match.group(1)) for name in names if (match := _METADATA_VERSION.fullmatch(name))]
    return max(versions, default=None)


def current_metadata_location(catalog: Mapping[str, str], warehouse: str | None, identifier: str) -> str | None:
    """The table's current metadata file, or None when the table does not exist.

    For the Hadoop catalog this does what Iceberg's ``HadoopTableOperations`` does: start from
    ``version-hint.text`` or, when the hint is missing or unreadable, from the highest
    ``v<N>.metadata.json`` listed, and follow newer versions from there.
    """
    if is_hadoop_catalog(catalog):
        metadata_dir = _hadoop_table_dir(warehouse, identifier) / "metadata"
        version = _hinted_version(metadata_dir)
        if version is None or not (metadata_dir / f"v{version}.metadata.json").exists():
            version = _highest_listed_version(metadata_dir)
        if version is None:
            return None
        # The hint can lag a commit that renamed a newer version into place: follow the chain.
        while (metadata_dir / f"v{version + 1}.metadata.json").exists():
            version += 1
        return str(metadata_dir / f"v{version}.metadata.json")
    try:
        return catalog_client(catalog, warehouse).load_table(identifier).metadata_location
    except NoSuchTableError:
        return None


def load_committed_table(catalog: Mapping[str, str], warehouse: str | None, identifier: str) -> Table | None:
    """The table as last committed, read-only, or None when it does not exist: for a catalog with
    a client, what one load of it returned (one round trip to a REST catalog), reading its files
    with the FileIO the catalog configured (on S3: its endpoint and credentials)."""
    if is_hadoop_catalog(catalog):
        location = current_metadata_location(catalog, warehouse, identifier)
        return StaticTable.from_metadata(location) if location else None
    try:
        loaded = catalog_client(catalog, warehouse).load_table(identifier)
    except NoSuchTableError:
        return None
    return StaticTable(
        identifier=loaded.name(),
        metadata=loaded.metadata,
        metadata_location=loaded.metadata_location,
        io=loaded.io,
        catalog=NoopCatalog(CATALOG_NAME),
    )
