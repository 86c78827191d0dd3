"""A local Iceberg REST catalog for the object-store tests and demo: Iceberg's own server.

``RESTCatalogServer`` (iceberg-open-api's test fixtures, ``jvm/maven/rest-catalog.pom.xml``) is
the server Iceberg tests its REST clients against: the REST protocol over a JDBC catalog, here in
a SQLite file under ``directory`` (a restart finds every table again), writing table metadata
with S3FileIO to the warehouse on the store. It commits a table change only when the change's
requirements (the snapshot a branch must still be at) hold, then swaps the table's pointer in the
database, which is the fence two committers racing through it meet. Not for production.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lakehouse_assets.jvm.connectors import REST_CATALOG_SERVER, S3_COMPATIBLE_ENV
from lakehouse_assets.ops.jvm_server import JvmServer, free_port, running
from lakehouse_assets.ops.s3_server import REGION, LocalS3Server


def _environment_name(key: str) -> str:
    """The server's environment variable for catalog property ``key`` (it reads ``CATALOG_*``,
    ``__`` as ``-`` and ``_`` as ``.``): ``s3.path-style-access`` -> ``CATALOG_S3_PATH__STYLE__ACCESS``."""
    return "CATALOG_" + key.replace("-", "__").replace(".", "_").upper()


@dataclass
class LocalRestCatalog(JvmServer):
    """The catalog's process and its URI; its warehouse is ``warehouse`` on ``store``."""

    store: LocalS3Server | None = None
    warehouse: str = ""

    @classmethod
    def at(cls, directory: Path, store: LocalS3Server, warehouse: str) -> LocalRestCatalog:
        """A catalog (not started yet) with its database under ``directory``, on a free port."""
        return cls("the REST catalog", REST_CATALOG_SERVER, directory, free_port(), store=store, warehouse=warehouse)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the catalog and wait until it accepts connections."""
        assert self.store is not None
        properties = {
            "rest.port": str(self.port),
            "catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            "uri": f"jdbc:sqlite:{self.directory / 'catalog.db'}",
            # One database connection, which the server's request threads take in turn: SQLite
            # has one writer, and with the default two, one connection's open read transaction
            # made the other's commit fail ("database is locked", a 500 and an unknown commit
            # state) for as long as tables committed at once.
            "clients": "1",
            "jdbc.schema-version": "V1",
            "warehouse": self.warehouse,
            **self.store.client_properties(),
        }
        environment = {_environment_name(key): value for key, value in properties.items()}
        environment |= {"AWS_REGION": REGION, **S3_COMPATIBLE_ENV}
        self.launch(self.java("org.apache.iceberg.rest.RESTCatalogServer"), environment)

    def catalog_properties(self) -> dict[str, str]:
        """The project's ``catalog`` map for this catalog and its store."""
        assert self.store is not None
        return {"type": "rest", "uri": self.uri, "warehouse": self.warehouse, **self.store.client_properties()}


@contextmanager
def local_rest_catalog(directory: Path, store: LocalS3Server, warehouse: str) -> Iterator[LocalRestCatalog]:
    """A running local REST catalog over ``warehouse`` on ``store``, stopped at the end."""
    with running(LocalRestCatalog.at(directory, store, warehouse)) as catalog:
        yield catalog
