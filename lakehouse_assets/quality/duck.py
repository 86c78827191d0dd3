"""DuckDB with its Iceberg extension, loaded from the installed extension packages (no network).

Tables on S3 (or an S3-compatible store) are read with DuckDB's httpfs extension, given the
catalog's S3 settings once per process by :func:`read_storage_of`.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from functools import cache
from importlib import resources
from urllib.parse import urlsplit

import duckdb

from lakehouse_assets.catalog.catalogs import resolved, uses_s3

STARTUP_EXTENSIONS = ("avro", "iceberg")
"""Loaded with the database; ``httpfs`` and ``aws`` only for tables on S3. Each comes from its
``duckdb-extension-<name>`` package."""


def _extension_file(extension: str, package: str) -> str:
    directory = resources.files(package) / "extensions" / f"v{duckdb.__version__}"
    return str(directory.joinpath(f"{extension}.duckdb_extension"))


@cache
def _database() -> duckdb.DuckDBPyConnection:
    """One in-memory database per process with the extensions loaded (installing and loading them
    takes a tenth of a second or more, once per database rather than once per check).

    Not dagster-duckdb's ``DuckDBResource``: its ``get_connection`` connects anew each time, which
    for an in-memory database is a new database, so every check would load the extensions again
    (140 ms against 0.35 ms for a cursor of this one, measured on 2 cores); and ``lakehouse sql``
    reads through this without Dagster."""
    connection = duckdb.connect()
    for extension in STARTUP_EXTENSIONS:
        _load(connection, extension)
    return connection


def _load(connection: duckdb.DuckDBPyConnection, extension: str) -> None:
    connection.execute(f"INSTALL '{_extension_file(extension, f'duckdb_extension_{extension}')}'")
    connection.execute(f"LOAD {extension}")


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


_REGISTERED_SECRETS: dict[str, tuple[tuple[str, str], ...]] = {}
"""The settings each S3 secret of the process's database was made from, by the secret's name."""
_SECRETS_LOCK = threading.Lock()


def _register_s3_secret(settings: tuple[tuple[str, str], ...]) -> None:
    """Give the process's database an S3 secret for these catalog properties (scoped to the
    warehouse's bucket): the keys the catalog names, else the standard AWS credential chain.

    One secret per scope, replaced when the settings change: DuckDB picks a secret by its scope
    alone, so two secrets for one bucket (another endpoint, other keys, in a process that serves
    both) would leave it to chance which one a read uses."""
    with _SECRETS_LOCK:
        _replace_s3_secret(settings)


def _replace_s3_secret(settings: tuple[tuple[str, str], ...]) -> None:
    properties = dict(settings)
    secret = {"TYPE": "s3", "REGION": properties.get("client.region") or properties.get("s3.region") or "us-east-1"}
    if "s3.access-key-id" in properties:
        secret |= {"KEY_ID": properties["s3.access-key-id"], "SECRET": properties.get("s3.secret-access-key", "")}
        if "s3.session-token" in properties:
            secret["SESSION_TOKEN"] = properties["s3.session-token"]
    else:
        secret["PROVIDER"] = "credential_chain"
    if endpoint := properties.get("s3.endpoint"):
        parts = urlsplit(endpoint)
        secret |= {"ENDPOINT": parts.netloc or parts.path, "USE_SSL": str(parts.scheme != "http").lower()}
    if properties.get("s3.path-style-access", "").lower() == "true":
        secret["URL_STYLE"] = "path"
    warehouse = properties.get("warehouse", "")
    if warehouse.startswith("s3://"):
        secret["SCOPE"] = "s3://" + warehouse.removeprefix("s3://").split("/", 1)[0]
    name = "lakehouse_s3_" + hashlib.sha256(secret.get("SCOPE", "").encode()).hexdigest()[:12]
    if _REGISTERED_SECRETS.get(name) == settings:
        return
    database = _database()
    _load(database, "httpfs")
    if "PROVIDER" in secret:
        _load(database, "aws")
    options = ", ".join(
        f"{key} {value if key in ('TYPE', 'PROVIDER', 'USE_SSL') else _literal(value)}" for key, value in secret.items()
    )
    database.execute(f"CREATE OR REPLACE SECRET {name} ({options})")
    _REGISTERED_SECRETS[name] = settings


def read_storage_of(catalog: Mapping[str, str]) -> None:
    """Let this process's DuckDB read the tables of ``catalog`` where they are: on S3 with the
    catalog's own S3 settings (``${env:}`` references read now), never logged. Nothing to do for
    tables on a file system; repeated calls cost nothing."""
    if uses_s3(catalog):
        _register_s3_secret(tuple(sorted(resolved(catalog).items())))


def iceberg_connection() -> duckdb.DuckDBPyConnection:
    """A DuckDB connection that can run ``iceberg_scan`` and ``iceberg_metadata`` (a cursor of the
    process's database: one per caller and thread)."""
    connection = _database().cursor()
    connection.execute("SET TimeZone = 'UTC'")
    return connection


def scan(metadata_location: str, snapshot_id: int) -> str:
    """SQL for the table's rows at exactly ``snapshot_id``, deletes applied."""
    return f"iceberg_scan('{metadata_location}', snapshot_from_id => {int(snapshot_id)})"


def manifest_entries(metadata_location: str, snapshot_id: int) -> str:
    """SQL for the manifest entries (data and delete files) of ``snapshot_id``."""
    return f"iceberg_metadata('{metadata_location}', snapshot_from_id => {int(snapshot_id)})"


def single_count(connection: duckdb.DuckDBPyConnection, sql: str) -> int:
    """The single number an aggregate query (``SELECT count(*) ...``) returns."""
    row = connection.sql(sql).fetchone()
    if row is None:
        raise ValueError(f"the aggregate query returned no row: {sql}")
    return int(row[0])
