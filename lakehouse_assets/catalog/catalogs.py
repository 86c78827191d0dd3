"""One catalog configuration, two clients: Iceberg's Spark catalog and PyIceberg's.

The config's ``catalog`` map uses Iceberg's own property names, as Spark's
``spark.sql.catalog.<name>.*`` settings do (``type``, ``uri``, ``warehouse``, ``jdbc.user``,
``catalog-impl``, ``io-impl``, ``s3.*``...). This module is the one mapping from it to each client:

- ``type: jdbc`` is PyIceberg's ``sql`` catalog: the JDBC URI becomes the matching SQLAlchemy URL
  with the ``jdbc.user``/``jdbc.password`` credentials, and both clients share Iceberg's
  ``iceberg_tables`` schema in the same database;
- ``rest``, ``hive`` and ``glue`` mean the same to both and pass through; so do ``catalog-impl``
  classes PyIceberg has a client for;
- ``hadoop`` (the embedded default) has no PyIceberg client: ``table_metadata`` reads its layout.

A value written ``${env:NAME}`` is read from the environment when a client is built, so secrets
stay out of the config file; errors show URIs :func:`without_credentials`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from lakehouse_assets.config.env_references import resolve_env_references
from lakehouse_assets.errors import ConfigError
from lakehouse_assets.jvm.connectors import S3_COMPATIBLE_ENV

HADOOP = "hadoop"

# The SQLAlchemy dialect (and driver PyIceberg's ``sql-postgres`` extra installs) per JDBC subprotocol.
_SQLALCHEMY_DIALECTS = {"postgresql": "postgresql+psycopg2", "mysql": "mysql+pymysql"}

# Iceberg's catalog classes PyIceberg has a client for, by the PyIceberg type.
_CATALOG_IMPL_TYPES = {
    "org.apache.iceberg.rest.RESTCatalog": "rest",
    "org.apache.iceberg.hive.HiveCatalog": "hive",
    "org.apache.iceberg.aws.glue.GlueCatalog": "glue",
    "org.apache.iceberg.jdbc.JdbcCatalog": "jdbc",
    "org.apache.iceberg.hadoop.HadoopCatalog": HADOOP,
}
_PASSED_THROUGH_TYPES = {"rest", "hive", "glue"}
# ``jdbc.*`` keys that configure Iceberg's JDBC catalog itself rather than the connection.
_JDBC_CATALOG_KEYS = {
    "jdbc.user",
    "jdbc.password",
    "jdbc.schema-version",
    "jdbc.strict-mode",
    "jdbc.init-catalog-tables",
}
# Catalog types whose warehouse is a location this project chooses when the config does not.
WAREHOUSE_TYPES = {HADOOP, "jdbc"}
S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
REST_SOCKET_TIMEOUT = "rest.client.socket-timeout-ms"
REST_SOCKET_TIMEOUT_MS = 120_000
REST_CONNECTION_TIMEOUT = "rest.client.connection-timeout-ms"
REST_CONNECTION_TIMEOUT_MS = 180_000
"""Iceberg's Java client's own default; PyIceberg's client gets the same (``rest_client``)."""
REST_CLIENT = "lakehouse_assets.catalog.rest_client.TimedRestCatalog"
S3_SCHEMES = ("s3://", "s3a://")


def catalog_type(catalog: Mapping[str, str]) -> str:
    """The catalog's type (``hadoop`` when neither ``type`` nor a known ``catalog-impl`` says)."""
    if "catalog-impl" in catalog and "type" not in catalog:
        return _CATALOG_IMPL_TYPES.get(catalog["catalog-impl"], catalog["catalog-impl"])
    return catalog.get("type", HADOOP)


def uses_s3(catalog: Mapping[str, str]) -> bool:
    """Whether the catalog's tables are on S3 (or an S3-compatible store) through Iceberg's
    S3FileIO: named as its ``io-impl``, or implied by an ``s3://`` warehouse."""
    return catalog.get("io-impl") == S3_FILE_IO or catalog.get("warehouse", "").startswith(S3_SCHEMES)


def resolved(catalog: Mapping[str, str]) -> dict[str, str]:
    """The properties with every ``${env:NAME}`` replaced by the variable's value.

    Raises ConfigError naming the key and the variable when the variable is not set.
    """
    return {key: resolve_env_references(value, f"catalog: {key}") for key, value in catalog.items()}


def without_credentials(uri: str) -> str:
    """``uri`` as it may be shown: ``scheme://user:password@host`` becomes ``scheme://***@host``."""
    return re.sub(r"//[^/@]*@", "//***@", uri)


def spark_catalog_properties(catalog: Mapping[str, str]) -> dict[str, str]:
    """The settings of an Iceberg ``SparkCatalog`` (without the ``spark.sql.catalog.<name>.`` prefix).

    A REST catalog's client gets a socket timeout unless the config sets one: Iceberg's waits for an
    answer without one, so a catalog server that hangs would hold a commit for ever. A commit whose
    answer timed out is decided by the table's ancestry like any other (``commit.fenced_pass``).
    """
    properties = resolved(catalog)
    if catalog_type(catalog) == "rest":
        properties.setdefault(REST_SOCKET_TIMEOUT, str(REST_SOCKET_TIMEOUT_MS))
    return properties


def pyiceberg_catalog_properties(catalog: Mapping[str, str]) -> dict[str, str]:
    """The properties of the same catalog for PyIceberg's ``load_catalog``.

    Raises ConfigError for a catalog PyIceberg cannot read (the checks and recovery need it).
    """
    if "s3.endpoint" in catalog:
        _use_s3_compatible_checksums()
    return _as_pyiceberg(catalog_type(catalog), resolved(catalog))


def _use_s3_compatible_checksums() -> None:
    """Have this process's PyArrow S3 client (the AWS SDK for C++, which reads the tables' data
    files for PyIceberg) send checksums only where a request needs them, as Spark's S3FileIO does
    on a store other than AWS (``S3_COMPATIBLE_SDK_SETTINGS``): by default it asks for response
    checksums that such stores refuse (S3Proxy answers a ranged read with 501). That SDK takes the
    setting only from the environment, read as each client is made; an operator's own value stays."""
    for name, value in S3_COMPATIBLE_ENV.items():
        os.environ.setdefault(name, value)


def check_catalog(catalog: dict[str, str]) -> None:
    """Raise ConfigError when the catalog cannot be mapped to both clients (secrets not read)."""
    if catalog_type(catalog) != HADOOP:
        _as_pyiceberg(catalog_type(catalog), dict(catalog))


def _as_pyiceberg(kind: str, properties: dict[str, str]) -> dict[str, str]:
    if kind == "jdbc":
        return _sql_catalog_properties(properties)
    if kind in _PASSED_THROUGH_TYPES:
        properties.pop("catalog-impl", None)
        if kind == "rest":  # PyIceberg's client with timeouts (a class named here has no ``type``)
            properties.pop("type", None)
            return {"py-catalog-impl": REST_CLIENT, **properties}
        return {**properties, "type": kind}
    if "py-catalog-impl" in properties:
        return properties
    raise ConfigError(
        f"catalog: type {kind!r} has no PyIceberg client, which the checks and recovery read the table with; "
        "use jdbc, rest, hive, glue or hadoop, or name PyIceberg's class in py-catalog-impl"
    )


def _sql_catalog_properties(properties: dict[str, str]) -> dict[str, str]:
    """Iceberg's JDBC catalog as PyIceberg's SQL catalog: ``jdbc:<dialect>://host/db`` becomes an
    SQLAlchemy URL carrying ``jdbc.user``/``jdbc.password``; other ``jdbc.*`` keys become URL
    parameters (``jdbc.sslmode`` -> ``?sslmode=``)."""
    uri = properties.get("uri", "")
    subprotocol, _, rest = uri.removeprefix("jdbc:").partition(":")
    if not uri.startswith("jdbc:") or subprotocol not in _SQLALCHEMY_DIALECTS or not rest.startswith("//"):
        raise ConfigError(
            f"catalog: uri {without_credentials(uri)!r} is not a JDBC URI this project maps to PyIceberg; "
            f"use jdbc:{{{'|'.join(_SQLALCHEMY_DIALECTS)}}}://host:port/database"
        )
    parts = urlsplit(rest)
    user, password = properties.get("jdbc.user") or parts.username, properties.get("jdbc.password") or parts.password
    credentials = quote(user or "", safe="") + (f":{quote(password, safe='')}" if password else "")
    parameters = dict(parse_qsl(parts.query))
    for key, value in properties.items():
        if key.startswith("jdbc.") and key not in _JDBC_CATALOG_KEYS:
            parameters[key.removeprefix("jdbc.")] = value
    url = f"{_SQLALCHEMY_DIALECTS[subprotocol]}://{credentials}{'@' if credentials else ''}{parts.hostname}"
    url += f":{parts.port}" if parts.port else ""
    url += parts.path + (f"?{urlencode(parameters)}" if parameters else "")
    kept = {key: value for key, value in properties.items() if not key.startswith("jdbc.") and key != "catalog-impl"}
    # A client is kept for the life of a process (a Dagster daemon's, say): let it survive a
    # restart of the database by checking a pooled connection before using it.
    return {"pool_pre_ping": "true", **kept, "type": "sql", "uri": url}
