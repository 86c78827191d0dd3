"""``lakehouse sql``: query the lakehouse's tables by their Iceberg names with DuckDB (no JVM).

Every table of the configuration, with its dead-letter table (and each router's), is a DuckDB view
named as in Iceberg (``sales.orders``, ``sales.orders_dead_letters``) over ``iceberg_scan`` of its
committed metadata, deletes applied; on any catalog, since the metadata location comes from the
catalog. ``snapshot_id`` reads the table holding that snapshot as of it, ``as_of`` every table as
it was at that time.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TextIO

import duckdb

from lakehouse_assets.commit.dead_letters import dead_letter_identifier
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.quality.duck import iceberg_connection, read_storage_of

MAX_TABLE_ROWS = 1000
"""The most rows the aligned table prints (``--json`` and ``--csv`` print all)."""


class QueryError(LakehouseError):
    """A query the lakehouse's DuckDB could not run; the message is DuckDB's, with the known tables."""


@dataclass(frozen=True)
class QueryResult:
    """Column names and rows of one query."""

    columns: list[str]
    rows: list[tuple]


def table_names(lake: Lakehouse) -> list[str]:
    """The configured tables, their dead-letter tables and the routers' dead-letter tables."""
    names: list[str] = []
    for identifier in lake.config.tables:
        names += [identifier, dead_letter_identifier(identifier)]
    names += [stream.router_dead_letter_identifier for stream in lake.config.streams if stream.is_router]
    return list(dict.fromkeys(names))


def connect(
    lake: Lakehouse, snapshot_id: int | None = None, as_of: datetime | None = None
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with a view per existing table, named by its Iceberg identifier."""
    read_storage_of(lake.config.catalog)
    connection = iceberg_connection()
    found_snapshot = snapshot_id is None
    for identifier in table_names(lake):
        table = lake.table(identifier)
        if table is None or table.current_snapshot() is None:
            continue
        at = ""
        if snapshot_id is not None and table.snapshot_by_id(snapshot_id) is not None:
            at, found_snapshot = f", snapshot_from_id => {int(snapshot_id)}", True
        elif as_of is not None:
            if not any(s.timestamp_ms <= as_of.timestamp() * 1000 for s in table.snapshots()):
                continue  # the table had no commit yet at that time
            at = f", snapshot_from_timestamp => TIMESTAMP '{as_of.isoformat(sep=' ')}'"
        namespace, name = identifier.rsplit(".", 1)
        connection.execute(f'CREATE SCHEMA IF NOT EXISTS "{namespace}"')
        escaped = table.metadata_location.replace("'", "''")
        connection.execute(
            f'CREATE OR REPLACE VIEW "{namespace}"."{name}" AS SELECT * FROM iceberg_scan(\'{escaped}\'{at})'
        )
    if not found_snapshot:
        raise QueryError(f"no table has snapshot {snapshot_id}; see `lakehouse status` for each table's snapshots")
    return connection


def view_names(connection: duckdb.DuckDBPyConnection) -> list[str]:
    """The tables ``connect`` made queryable, as ``namespace.table``."""
    rows = connection.sql(
        "SELECT schema_name || '.' || view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1"
    ).fetchall()
    return [row[0] for row in rows]


def run_query(connection: duckdb.DuckDBPyConnection, query: str, known: list[str]) -> QueryResult:
    """Run ``query``; a QueryError with DuckDB's message (and the known tables when one is missing)."""
    try:
        relation = connection.sql(query)
        if relation is None:
            return QueryResult([], [])
        return QueryResult(list(relation.columns), relation.fetchall())
    except duckdb.Error as error:
        message = str(error).strip().splitlines()[0]
        if isinstance(error, duckdb.CatalogException):
            message += f" (tables: {', '.join(known) or 'none yet: run the pipeline first'})"
        raise QueryError(message) from None


def write_result(result: QueryResult, output_format: str, out: TextIO | None = None) -> None:
    """Print ``result`` as an aligned table, a JSON array of objects, or CSV with a header (to
    ``out``, by default this process's standard output as it is at the call)."""
    out = out or sys.stdout
    if output_format == "json":
        json.dump([dict(zip(result.columns, row, strict=True)) for row in result.rows], out, default=str, indent=1)
        out.write("\n")
    elif output_format == "csv":
        writer = csv.writer(out)
        writer.writerow(result.columns)
        writer.writerows(result.rows)
    else:
        out.write(_aligned(result) + "\n")


def _aligned(result: QueryResult) -> str:
    if not result.columns:
        return "OK"
    shown = result.rows[:MAX_TABLE_ROWS]
    cells = [[("NULL" if value is None else str(value)).replace("\n", "\\n") for value in row] for row in shown]
    widths = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(result.columns)]
    line = lambda values: " | ".join(value.ljust(width) for value, width in zip(values, widths, strict=True))  # noqa: E731
    lines = [line(result.columns), "-+-".join("-" * width for width in widths), *(line(row) for row in cells)]
    more = len(result.rows) - len(shown)
    lines.append(
        f"({len(result.rows)} rows" + (f", first {len(shown)} shown; use --csv or --json for all)" if more else ")")
    )
    return "\n".join(lines)


def statements(lines: Iterator[str]) -> Iterator[str]:
    """Statements of an interactive session: lines joined until one ends with ``;``."""
    pending: list[str] = []
    for line in lines:
        pending.append(line)
        if line.rstrip().endswith(";"):
            yield "\n".join(pending)
            pending = []
    if "".join(pending).strip():
        yield "\n".join(pending)


def sql_session(
    lake: Lakehouse,
    query: str | None,
    output_format: str = "table",
    snapshot_id: int | None = None,
    as_of: datetime | None = None,
) -> int:
    """Run ``query``, or an interactive session reading statements from standard input when it is
    None; returns the exit code (a failed statement of a session is reported and the session goes on)."""
    connection = connect(lake, snapshot_id, as_of)
    known = view_names(connection)
    if as_of is not None and not known:
        raise QueryError(f"no table had a commit by {as_of.isoformat()}")
    if query is not None:
        write_result(run_query(connection, query, known), output_format)
        return 0
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"tables: {', '.join(known) or 'none yet'}; end each statement with ';', Ctrl-D to leave")
    failed = 0
    for statement in statements(_prompted_lines(interactive)):
        try:
            write_result(run_query(connection, statement, known), output_format)
        except QueryError as error:
            failed += 1
            print(f"lakehouse: {error}", file=sys.stderr)
    return 1 if failed else 0


def _prompted_lines(interactive: bool) -> Iterator[str]:
    while True:
        try:
            yield input("lakehouse> ") if interactive else next(sys.stdin).rstrip("\n")
        except (EOFError, StopIteration):
            return
