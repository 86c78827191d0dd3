"""The key index of a change table: the key, order value, data file and position of each live row.

A change batch looks its keys up here instead of scanning the table, so its commit costs what
its changes cost (``row_deltas``). The index is derived from the table and never its source of
truth: it names the table and the snapshot it describes, and one that is missing, describes
another snapshot (a commit it did not see: another host, maintenance, a crash between a commit
and the index's update), or fails to read or to add up is rebuilt from the table before use
(Spark reads the keys with Iceberg's ``_file`` and ``_pos`` metadata columns).

It lives beside the staging ledger, in the storage root every host shares, under
``key_index/<table>/``:

- ``index.json``: the table's uuid, the snapshot, the key and order columns, the segment files
  with their row counts and sizes; written by rename, so it names complete segments only;
- entry segments (Parquet): key columns, ``_lakehouse_order``, ``_lakehouse_file``, ``_lakehouse_pos``;
- removed segments (Parquet): ``_lakehouse_file``, ``_lakehouse_pos`` of rows deleted since.

The live rows are the entries less the removed positions. Each commit adds up to one segment of
each kind; every ``FOLD_COMMITS`` commits they are folded into one entry segment (a DuckDB copy of
the live rows).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import duckdb
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from lakehouse_assets import faults
from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.faults import crash_point
from lakehouse_assets.lakehouse import Lakehouse

MANIFEST = "index.json"
# A segment a new manifest no longer names is removed this long after: a reader (another host
# sharing the storage root) may still be reading it by the manifest before.
RETIRED_GRACE_SECONDS = 600
# A file no manifest ever named (a killed writer's segment, a batch's working files) is removed
# once this old: a rebuild or a batch may still be writing it.
UNNAMED_GRACE_SECONDS = 24 * 3600
FORMAT_VERSION = 2
FOLD_COMMITS = 16
ORDER = "_lakehouse_order"
FILE = "_lakehouse_file"
POSITION = "_lakehouse_pos"


def sql_string(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def sql_name(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def parquet_scan(paths: Sequence[Path | str]) -> str:
    """SQL reading the Parquet files ``paths`` as one relation."""
    return f"read_parquet([{', '.join(sql_string(str(path)) for path in paths)}])"


@dataclass(frozen=True)
class Segment:
    """One Parquet file of the index (its path relative to the index directory)."""

    file: str
    rows: int
    size: int


@dataclass(frozen=True)
class IndexState:
    """What ``index.json`` says: the table and snapshot the index describes, and its segments."""

    table_uuid: str
    snapshot_id: int | None
    key_columns: tuple[str, ...]
    order_column: str | None
    entries: tuple[Segment, ...]
    removed: tuple[Segment, ...]
    unfolded_commits: int = 0
    """Commits recorded since the last rebuild or fold."""

    @property
    def live_rows(self) -> int:
        return sum(s.rows for s in self.entries) - sum(s.rows for s in self.removed)

    def describes(self, table: Table, snapshot_id: int | None, keys: Sequence[str], order: str | None) -> bool:
        """Whether this index is of ``table`` at ``snapshot_id`` with these columns."""
        return (
            self.table_uuid == str(table.metadata.table_uuid)
            and self.snapshot_id == snapshot_id
            and self.key_columns == tuple(keys)
            and self.order_column == order
        )


def _live_rows_of(table: Table, snapshot_id: int | None) -> int | None:
    """The live rows of the table at the snapshot by its summary (data rows less position deletes),
    or None when the summary does not say (or equality deletes make it unknowable)."""
    if snapshot_id is None:
        return 0
    snapshot = table.snapshot_by_id(snapshot_id)
    summary = snapshot.summary.additional_properties if snapshot and snapshot.summary else {}
    if "total-records" not in summary or int(summary.get("total-equality-deletes", "0")):
        return None
    return int(summary["total-records"]) - int(summary.get("total-position-deletes", "0"))


class KeyIndex:
    """The key index of one table: its directory and columns, read and kept with DuckDB."""

    def __init__(self, directory: Path, identifier: str, key_columns: Sequence[str], order_column: str | None) -> None:
        self.directory = directory
        self.identifier = identifier
        self.key_columns = tuple(key_columns)
        self.order_column = order_column

    @classmethod
    def of(cls, lake: Lakehouse, identifier: str, key_columns: Sequence[str], order_column: str | None) -> KeyIndex:
        return cls(lake.paths.key_index(identifier), identifier, key_columns, order_column)

    # -- reading ---------------------------------------------------------------------------------

    def _read_manifest(self) -> IndexState | None:
        try:
            document = json.loads((self.directory / MANIFEST).read_text())
            if document.pop("format") != FORMAT_VERSION:
                return None
            return IndexState(
                table_uuid=document["table_uuid"],
                snapshot_id=document["snapshot_id"],
                key_columns=tuple(document["key_columns"]),
                order_column=document["order_column"],
                entries=tuple(Segment(**s) for s in document["entries"]),
                removed=tuple(Segment(**s) for s in document["removed"]),
                unfolded_commits=document["unfolded_commits"],
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _intact(self, state: IndexState, table: Table) -> bool:
        """Whether every segment is there at its recorded size and the live rows add up to the table's."""
        for segment in (*state.entries, *state.removed):
            path = self.directory / segment.file
            if not path.is_file() or path.stat().st_size != segment.size:
                return False
        expected = _live_rows_of(table, state.snapshot_id)
        return expected is None or expected == state.live_rows

    def kept(self, table: Table, snapshot_id: int | None) -> IndexState | None:
        """The index as kept when it describes ``table`` at ``snapshot_id`` and is intact, else None."""
        state = self._read_manifest()
        if (
            state is not None
            and state.describes(table, snapshot_id, self.key_columns, self.order_column)
            and self._intact(state, table)
        ):
            return state
        return None

    def current(self, spark: SparkSession, table: Table, snapshot_id: int | None) -> IndexState:
        """The index of ``table`` at ``snapshot_id``: as kept, or rebuilt from the table when it is
        missing, describes another table or snapshot, or is damaged."""
        return self.kept(table, snapshot_id) or self.rebuild(spark, table, snapshot_id)

    def live_rows_sql(self, state: IndexState) -> str:
        """SQL for the live rows: the entries whose position was not removed since."""
        entries = parquet_scan([self.directory / s.file for s in state.entries])
        if not state.entries:
            return self._empty_entries_sql()
        if not state.removed:
            return entries
        removed = parquet_scan([self.directory / s.file for s in state.removed])
        return (
            f"(SELECT * FROM {entries} e WHERE NOT EXISTS (SELECT 1 FROM {removed} r "
            f"WHERE r.{FILE} = e.{FILE} AND r.{POSITION} = e.{POSITION}))"
        )

    def _empty_entries_sql(self) -> str:
        keys = ", ".join(f"NULL AS {sql_name(k)}" for k in self.key_columns)
        return f"(SELECT {keys}, NULL AS {ORDER}, NULL::VARCHAR AS {FILE}, NULL::BIGINT AS {POSITION} WHERE false)"

    # -- writing ---------------------------------------------------------------------------------

    def rebuild(self, spark: SparkSession, table: Table, snapshot_id: int | None) -> IndexState:
        """Build the index of ``table`` at ``snapshot_id`` from the table's live rows."""
        self.directory.mkdir(parents=True, exist_ok=True)
        entries: tuple[Segment, ...] = ()
        if snapshot_id is not None:
            name = f"rebuild-{uuid.uuid4().hex}"
            keys = ", ".join(f"`{k}`" for k in self.key_columns)
            order = f"`{self.order_column}`" if self.order_column else "CAST(NULL AS STRING)"
            spark.sql(
                f"SELECT {keys}, {order} AS {ORDER}, _file AS {FILE}, _pos AS {POSITION} "
                f"FROM {qualified_name(self.identifier)} VERSION AS OF {int(snapshot_id)}"
            ).write.parquet(str(self.directory / name))
            crash_point(faults.KEY_INDEX_DURING_REBUILD)
            entries = tuple(
                self._segment(path.relative_to(self.directory))
                for path in sorted((self.directory / name).glob("*.parquet"))
            )
        state = IndexState(
            str(table.metadata.table_uuid), snapshot_id, self.key_columns, self.order_column, entries, ()
        )
        self._write_manifest(state)
        return state

    def record(
        self,
        state: IndexState,
        snapshot_id: int,
        connection: duckdb.DuckDBPyConnection,
        added_sql: str | None,
        removed_sql: str | None,
    ) -> IndexState:
        """The index after a commit that made ``snapshot_id`` from ``state``'s snapshot: the rows
        ``added_sql`` selects (entry columns) are added and the positions ``removed_sql`` selects
        removed. Folds the segments when there are too many."""
        entries, removed = state.entries, state.removed
        if added_sql is not None:
            entries = (*entries, self._copy(connection, added_sql, "entries"))
        if removed_sql is not None:
            removed = (*removed, self._copy(connection, removed_sql, "removed"))
        updated = replace(
            state,
            snapshot_id=snapshot_id,
            entries=entries,
            removed=removed,
            unfolded_commits=state.unfolded_commits + 1,
        )
        if updated.unfolded_commits >= FOLD_COMMITS:
            folded = self._copy(connection, f"SELECT * FROM {self.live_rows_sql(updated)}", "entries")
            updated = replace(updated, entries=(folded,), removed=(), unfolded_commits=0)
        crash_point(faults.KEY_INDEX_BEFORE_MANIFEST)
        self._write_manifest(updated)
        return updated

    def _copy(self, connection: duckdb.DuckDBPyConnection, sql: str, kind: str) -> Segment:
        name = f"{kind}-{uuid.uuid4().hex}.parquet"
        written = connection.execute(f"COPY ({sql}) TO {sql_string(str(self.directory / name))} (FORMAT parquet)")
        counted = written.fetchone()
        return self._segment(Path(name), int(counted[0]) if counted else None)

    def _segment(self, relative: Path, rows: int | None = None) -> Segment:
        path = self.directory / relative
        if rows is None:
            with duckdb.connect() as connection:
                counted = connection.execute(f"SELECT count(*) FROM {parquet_scan([path])}").fetchone()
            rows = int(counted[0]) if counted else 0
        return Segment(str(relative), rows, path.stat().st_size)

    def _write_manifest(self, state: IndexState) -> None:
        """Write ``index.json`` by rename. The segments the manifest before named and this one does
        not are retired; a file retired longer than a grace, or never named and older than
        another, is removed."""
        now = time.time()
        named = {Path(s.file).parts[0] for s in (*state.entries, *state.removed)}
        retired = self._retired()
        previous = self._read_manifest()
        for segment in (*previous.entries, *previous.removed) if previous else ():
            retired.setdefault(Path(segment.file).parts[0], now)
        expired = {name for name, since in retired.items() if now - since > RETIRED_GRACE_SECONDS}
        still_retired = {name: since for name, since in retired.items() if name not in named | expired}
        document = {"format": FORMAT_VERSION, **asdict(state), "retired": still_retired}
        temporary = self.directory / f".{MANIFEST}.{uuid.uuid4().hex}"
        temporary.write_text(json.dumps(document))
        os.replace(temporary, self.directory / MANIFEST)
        for path in self.directory.iterdir():
            unnamed = path.name not in named | set(retired) | {MANIFEST}
            if (path.name in expired and path.name not in named) or (
                unnamed and now - path.stat().st_mtime > UNNAMED_GRACE_SECONDS
            ):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)

    def _retired(self) -> dict[str, float]:
        """The retired files the manifest names, with when they were retired."""
        try:
            retired = json.loads((self.directory / MANIFEST).read_text()).get("retired", {})
            return {str(name): float(since) for name, since in retired.items()}
        except (OSError, ValueError, AttributeError, TypeError):
            return {}
