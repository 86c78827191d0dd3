"""The streams a router derives: one per table it has routed events to, which reads that table's
route directory like a landing directory and writes the table with the router's settings."""

from __future__ import annotations

import re
from pathlib import Path

from lakehouse_assets.config.spec import LakehouseConfig, LandingSourceSpec, SourceSpec, StreamSpec

# The one grammar of a table name a router resolves (lower-cased first, as Hive and Glue catalogs
# do): two to four parts of letters, digits and ``_``, each at most 128 characters; nothing else,
# so no control character, line break, path separator or empty part. ``__`` joins the parts of a
# routed stream's name, so routing refuses it too. Unanchored: Python matches it whole, Spark with
# ``^...\z`` (``$`` would also match before a final line break).
ROUTED_TABLE = r"[a-z_][a-z0-9_]{0,127}(\.[a-z_][a-z0-9_]{0,127}){1,3}"


def is_routed_table(name: str) -> bool:
    """True for a table name a router may resolve (``ROUTED_TABLE``), ``__`` aside."""
    return re.fullmatch(ROUTED_TABLE, name) is not None and "__" not in name


def routed_stream_name(router: str, table_identifier: str) -> str:
    return f"{router}__{table_identifier.replace('.', '__')}"


def routed_stream(router: StreamSpec, table_identifier: str, route_directory: Path) -> StreamSpec:
    """The stream that commits the events ``router`` routed to ``table_identifier``."""
    landing = (router.source.landing or LandingSourceSpec()).model_copy(update={"path": str(route_directory)})
    return router.model_copy(
        update={
            "name": routed_stream_name(router.name, table_identifier),
            "table_identifier": table_identifier,
            "source": SourceSpec(landing=landing),
            "routed_from": router.name,
        }
    )


def with_routes(config: LakehouseConfig, routes: Path) -> LakehouseConfig:
    """``config`` plus one derived stream per table a router has routed events to.

    ``routes/<router>/<table>/`` holds the events routed to ``<table>``; the derived stream
    ``<router>__<namespace>__<table>`` reads them like a landing directory and writes the table
    with the router's settings.
    """
    derived: list[StreamSpec] = []
    for router in config.routers():
        directory = routes / router.name
        entries = directory.iterdir() if directory.is_dir() else []
        # Only directories the router writes: a name made by hand that no route could have
        # (see routing.ROUTED_IDENTIFIER) must not stop the code location from loading.
        tables = sorted(entry.name for entry in entries if entry.is_dir() and is_routed_table(entry.name))
        derived.extend(routed_stream(router, table, directory / table) for table in tables)
    return config.model_copy(update={"streams": [*config.streams, *derived]}) if derived else config
