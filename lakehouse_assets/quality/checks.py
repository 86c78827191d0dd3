"""What a check verifies, on exactly one committed snapshot, with readers independent of Spark.

DuckDB's Iceberg extension reads the rows and manifests; PyIceberg reads snapshot summaries.
Every check returns what it found, so a failure in the Dagster UI explains itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import duckdb
from pyiceberg.table import StaticTable

from lakehouse_assets.batches.staged_format import DELETE, OPERATION_COLUMN, REASON_COLUMN
from lakehouse_assets.catalog.iceberg_types import IcebergType, duckdb_type, evolves_into, iceberg_type_name, parse_type
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.commit.branches import audit_state
from lakehouse_assets.commit.recovery import CommitHistory, commit_history
from lakehouse_assets.config.spec import SYSTEM_COLUMN_PREFIX, ColumnSpec, ExpectationSpec
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.quality.duck import manifest_entries, scan, single_count

EXPECTATION_EXAMPLES = 5


@dataclass(frozen=True)
class CheckOutcome:
    """A check's verdict and what it found."""

    passed: bool
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CommittedSnapshot:
    """The exact snapshot a check reads: the metadata file that holds it, its id, and the FileIO
    properties to read the file with (``Lakehouse.file_io_properties``: on S3, a secret)."""

    metadata_location: str
    snapshot_id: int
    io_properties: Mapping[str, str] = field(default_factory=dict, repr=False)

    def table(self) -> StaticTable:
        return StaticTable.from_metadata(self.metadata_location, dict(self.io_properties))


def current_snapshot(lake: Lakehouse, table_identifier: str) -> CommittedSnapshot | None:
    """The table's snapshot as it is now, whoever committed it: main's, or under ``publish: audit``
    the audit branch's while it holds commits main does not; None while the table has none."""
    table = lake.table(table_identifier)
    if table is None:
        return None
    if lake.config.audits(table_identifier) and (state := audit_state(table)).awaiting_publish and state.audit:
        return CommittedSnapshot(table.metadata_location, state.audit, lake.file_io_properties)
    main = table.current_snapshot()
    return CommittedSnapshot(table.metadata_location, main.snapshot_id, lake.file_io_properties) if main else None


def _comparable(duckdb_type_name: str) -> str:
    return duckdb_type_name.replace(" ", "").replace('"', "")


def snapshot_columns(snapshot: CommittedSnapshot) -> list:
    """The Iceberg fields of the table's schema at ``snapshot``."""
    table = snapshot.table()
    recorded = table.metadata.snapshot_by_id(snapshot.snapshot_id)
    schema_id = recorded.schema_id if recorded else None
    schema = next((s for s in table.metadata.schemas if s.schema_id == schema_id), table.schema())
    return list(schema.fields)


def check_schema(
    connection: duckdb.DuckDBPyConnection,
    snapshot: CommittedSnapshot,
    declared: list[ColumnSpec],
    evolves: bool = False,
    relaxes: bool = False,
) -> CheckOutcome:
    """The snapshot's columns, types and required flags are the declared ones, in order; with schema
    evolution, optional columns may follow them and a declared type may have been promoted, and
    with ``relax_required`` a declared required column may have become optional."""
    if not declared:
        return CheckOutcome(True, "no schema declared; the table's own schema is used")
    described = connection.sql(f"DESCRIBE SELECT * FROM {scan(snapshot.metadata_location, snapshot.snapshot_id)}")
    # The pipeline's own columns (a Debezium table's source position) are not the user's schema.
    actual = [
        (name, _comparable(kind))
        for name, kind, *_ in described.fetchall()
        if not name.startswith(SYSTEM_COLUMN_PREFIX)
    ]
    iceberg_schema = snapshot.table().schema()
    evolved = {field.name: iceberg_type_name(field.field_type) for field in iceberg_schema.fields} if evolves else {}

    def expected_type(column: ColumnSpec) -> IcebergType:
        # With schema evolution a declared type may have been promoted (int to long, ...).
        try:
            actual = parse_type(evolved[column.name])
        except (KeyError, ValueError):  # not a column, or of a type the grammar has no name for
            return column.iceberg_type
        return actual if evolves_into(column.iceberg_type, actual) else column.iceberg_type

    expected = [(column.name, _comparable(duckdb_type(expected_type(column)))) for column in declared]
    required_actual = sorted(f.name for f in iceberg_schema.fields if f.required)
    required_expected = sorted(column.name for column in declared if column.required)
    compared = actual[: len(expected)] if evolves else actual
    problems = []
    if compared != expected:
        problems.append(f"columns {compared} differ from declared {expected}")
    relaxed_only = relaxes and set(required_actual) <= set(required_expected)
    if required_actual != required_expected and not relaxed_only:
        problems.append(f"required columns {required_actual} differ from declared {required_expected}")
    added = [f"{name} {kind}" for name, kind in actual[len(expected) :]] if evolves else []
    return CheckOutcome(
        not problems,
        "; ".join(problems)
        or "schema matches the declared columns"
        + (f", plus {len(added)} columns added by schema evolution" if added else ""),
        {
            "columns": [f"{name} {kind}" for name, kind in actual],
            "required": required_actual,
            "added_by_evolution": added,
        },
    )


def _history(snapshot: CommittedSnapshot) -> CommitHistory:
    return commit_history(snapshot.table().metadata, snapshot.snapshot_id)


def check_row_count(connection: duckdb.DuckDBPyConnection, snapshot: CommittedSnapshot) -> CheckOutcome:
    """The snapshot holds exactly the rows its lakehouse commits added net (appended, or inserted
    minus deleted by a MERGE), counting expired commits through the maintenance checkpoint."""
    counted = single_count(connection, f"SELECT count(*) FROM {scan(snapshot.metadata_location, snapshot.snapshot_id)}")
    staged = _history(snapshot).net_rows
    return CheckOutcome(
        counted == staged,
        f"DuckDB counts {counted} rows; the committed batches added {staged} net",
        {"rows_read": counted, "rows_staged": staged},
    )


def check_sequence_ranges(snapshot: CommittedSnapshot) -> CheckOutcome:
    """Per stream, the batch ranges along the ancestry start at 1 (or after the checkpoint of
    expired commits) and have no gap, overlap or repeat."""
    history = _history(snapshot)
    next_expected: dict[str, int] = defaultdict(lambda: 1)
    if history.base:
        next_expected.update({stream: last + 1 for stream, last in history.base.sequences.items()})
    problems = []
    ranges: dict[str, list[str]] = defaultdict(list)
    for commit in history.commits:
        stream, first, last = commit.stream, commit.first_sequence, commit.last_sequence
        ranges[stream].append(summary_keys.format_batch_range(first, last))
        if first != next_expected[stream] or last < first:
            kind = "gap" if first > next_expected[stream] else "overlap or repeat"
            problems.append(f"stream {stream}: {kind}: range {first}-{last} after {next_expected[stream] - 1}")
        next_expected[stream] = max(next_expected[stream], last + 1)
    metadata: dict[str, Any] = {"ranges": {stream: ", ".join(found) for stream, found in ranges.items()}}
    if history.base:
        metadata["checkpoint"] = {"snapshot_id": history.base.snapshot_id, "sequences": history.base.sequences}
    return CheckOutcome(
        not problems,
        "; ".join(problems) or "batch ranges are contiguous for every stream",
        metadata,
    )


def check_unique_data_files(connection: duckdb.DuckDBPyConnection, snapshot: CommittedSnapshot) -> CheckOutcome:
    """No live data file is referenced twice by the snapshot's manifests."""
    entries = manifest_entries(snapshot.metadata_location, snapshot.snapshot_id)
    duplicates = connection.sql(
        f"SELECT file_path, count(*) AS n FROM {entries} "
        "WHERE manifest_content = 'DATA' AND status <> 'DELETED' AND content <> 'DELETED' "
        "GROUP BY file_path HAVING count(*) > 1 ORDER BY file_path"
    ).fetchall()
    files = single_count(
        connection,
        f"SELECT count(*) FROM {entries} WHERE manifest_content = 'DATA' "
        "AND status <> 'DELETED' AND content <> 'DELETED'",
    )
    return CheckOutcome(
        not duplicates,
        f"{len(duplicates)} data files referenced more than once"
        if duplicates
        else f"{files} data files, each referenced once",
        {"data_files": files, "duplicated": [path for path, _ in duplicates[:20]]},
    )


def check_keys_unique(
    connection: duckdb.DuckDBPyConnection, snapshot: CommittedSnapshot, keys: list[str]
) -> CheckOutcome:
    """No identifier key appears twice in the snapshot."""
    key_list = ", ".join(f'"{key}"' for key in keys)
    duplicates = connection.sql(
        f"SELECT {key_list}, count(*) AS n FROM {scan(snapshot.metadata_location, snapshot.snapshot_id)} "
        f"GROUP BY {key_list} HAVING count(*) > 1 ORDER BY n DESC LIMIT 20"
    ).fetchall()
    return CheckOutcome(
        not duplicates,
        f"{len(duplicates)} keys appear more than once" if duplicates else f"every ({key_list}) is unique",
        {"duplicated_keys": [str(row[:-1]) for row in duplicates]},
    )


@dataclass(frozen=True)
class CommittedChanges:
    """One committed change batch: its sequence, the snapshot its MERGE made, its staged Parquet."""

    sequence: int
    snapshot_id: int
    staged_parquet: str


def check_changes_applied(
    connection: duckdb.DuckDBPyConnection,
    metadata_location: str,
    batches: list[CommittedChanges],
    keys: list[str],
    columns: list[str],
    order_column: str | None = None,
) -> CheckOutcome:
    """On each batch's own snapshot, its net deletes are absent and its upserts hold its values (NULL
    in a column added after the batch was staged: an upsert writes the whole row), except the
    changes the row was already newer than by ``order_column`` (skipped as stale)."""
    join = " AND ".join(f't."{key}" = c."{key}"' for key in keys)
    newer = f'coalesce(t."{order_column}" > c."{order_column}", false)' if order_column else "false"
    problems, deletes, upserts = [], 0, 0
    for batch in batches:
        changes = f"(SELECT * FROM read_parquet('{batch.staged_parquet}/*.parquet') WHERE {REASON_COLUMN} IS NULL)"
        staged = {row[0] for row in connection.sql(f"DESCRIBE SELECT * FROM {changes}").fetchall()}
        differs = " OR ".join(
            f't."{column}" IS DISTINCT FROM c."{column}"' if column in staged else f't."{column}" IS NOT NULL'
            for column in columns
        )
        table = scan(metadata_location, batch.snapshot_id)
        deletes += single_count(connection, f"SELECT count(*) FROM {changes} WHERE {OPERATION_COLUMN} = '{DELETE}'")
        upserts += single_count(connection, f"SELECT count(*) FROM {changes} WHERE {OPERATION_COLUMN} <> '{DELETE}'")
        still_there = single_count(
            connection,
            f"SELECT count(*) FROM {changes} c JOIN {table} t ON {join} "
            f"WHERE c.{OPERATION_COLUMN} = '{DELETE}' AND NOT {newer}",
        )
        wrong = single_count(
            connection,
            f"SELECT count(*) FROM {changes} c LEFT JOIN {table} t ON {join} "
            f"WHERE c.{OPERATION_COLUMN} <> '{DELETE}' AND (t.\"{keys[0]}\" IS NULL OR {differs}) AND NOT {newer}",
        )
        if still_there:
            problems.append(f"batch {batch.sequence}: {still_there} deleted keys are still present")
        if wrong:
            problems.append(f"batch {batch.sequence}: {wrong} upserted keys are missing or hold other values")
    return CheckOutcome(
        not problems,
        "; ".join(problems)
        or f"{len(batches)} batches: {deletes} deleted keys absent, {upserts} upserted keys hold their values",
        {"batches": [batch.sequence for batch in batches], "deleted_keys": deletes, "upserted_keys": upserts},
    )


def check_no_new_dead_letters(
    connection: duckdb.DuckDBPyConnection,
    dead_letters: CommittedSnapshot | None,
    stream: str,
    first_sequence: int,
    last_sequence: int,
) -> CheckOutcome:
    """No event of the committed batches went to the dead-letter table; otherwise how many, and why."""
    if dead_letters is None:
        return CheckOutcome(True, f"stream {stream}: no dead letters so far")
    rows = connection.sql(
        f"SELECT reason, count(*) AS n FROM {scan(dead_letters.metadata_location, dead_letters.snapshot_id)} "
        f"WHERE stream = '{stream}' AND batch_sequence BETWEEN {first_sequence} AND {last_sequence} "
        "GROUP BY reason ORDER BY n DESC, reason"
    ).fetchall()
    total = sum(count for _, count in rows)
    return CheckOutcome(
        total == 0,
        f"stream {stream}: {total} events of batches {first_sequence}-{last_sequence} went to the dead letters"
        if total
        else f"stream {stream}: no event of batches {first_sequence}-{last_sequence} went to the dead letters",
        {"dead_letters": total, "reasons": {reason: count for reason, count in rows[:10]}},
    )


def uncoercible_values(snapshot: CommittedSnapshot, stream: str, first_sequence: int, last_sequence: int) -> dict:
    """Per column, the events of the stream's committed batches in the range whose value did not
    coerce to the column's type and was written as NULL (the commits' ``lakehouse.uncoercible-values``)."""
    totals: dict[str, int] = defaultdict(int)
    for commit in _history(snapshot).commits:
        overlaps = first_sequence <= commit.last_sequence and commit.first_sequence <= last_sequence
        if commit.stream == stream and overlaps:
            for column, count in commit.uncoercible_values.items():
                totals[column] += count
    return dict(sorted(totals.items()))


def check_expectations(
    connection: duckdb.DuckDBPyConnection, snapshot: CommittedSnapshot, expectations: list[ExpectationSpec]
) -> CheckOutcome:
    """Every row of the snapshot meets every expectation (a NULL condition does not); otherwise how
    many rows miss each, with a few of them."""
    table = scan(snapshot.metadata_location, snapshot.snapshot_id)
    missed: dict[str, int] = {}
    examples: dict[str, list[str]] = {}
    for expectation in expectations:
        unmet = f"FROM {table} t WHERE NOT coalesce(({expectation.condition}), false)"
        unmet_rows = single_count(connection, f"SELECT count(*) {unmet}")
        if unmet_rows:
            missed[expectation.name] = unmet_rows
            rows = connection.sql(f"SELECT to_json(t)::VARCHAR {unmet} LIMIT {EXPECTATION_EXAMPLES}").fetchall()
            examples[expectation.name] = [row for (row,) in rows]
    problems = [
        f"{count} rows do not meet {name} ({next(e.condition for e in expectations if e.name == name)})"
        for name, count in missed.items()
    ]
    return CheckOutcome(
        not missed,
        "; ".join(problems) or f"every row meets {', '.join(e.name for e in expectations)}",
        {"rows_not_meeting": missed, "examples": examples},
    )


def check_staged_rejects(
    connection: duckdb.DuckDBPyConnection, stream: str, first: int, last: int, staged_parquet: list[str]
) -> CheckOutcome:
    """No event of the batches was rejected when staged; otherwise how many, and why. For audited
    batches, whose dead letters reach the dead-letter table only when they are published."""
    rows = []
    if staged_parquet:
        files = ", ".join(f"'{path}/*.parquet'" for path in staged_parquet)
        rows = connection.sql(
            f"SELECT {REASON_COLUMN}, count(*) AS n FROM read_parquet([{files}], union_by_name => true) "
            f"WHERE {REASON_COLUMN} IS NOT NULL GROUP BY ALL ORDER BY n DESC, {REASON_COLUMN}"
        ).fetchall()
    total = sum(count for _, count in rows)
    return CheckOutcome(
        total == 0,
        f"stream {stream}: {total} events of batches {first}-{last} go to the dead letters when published"
        if total
        else f"stream {stream}: no event of batches {first}-{last} was rejected",
        {"dead_letters": total, "reasons": {reason: count for reason, count in rows[:10]}},
    )
