"""The invariant checker: the tables against an oracle built only from the landing files.

It reads the tables with DuckDB and PyIceberg (no Spark) and returns every violation it finds:

- each table's rows equal the oracle (appends: every valid event once; changes: the model of the
  changes applied in landing order; a dead letter replayed by ``lakehouse dlq replay`` counts at
  its replay, in place of its first landing), and DuckDB and PyIceberg read the same rows;
- no identifier key appears twice in the change table;
- every rejected event is in the dead-letter table exactly once;
- per stream, batch ranges along the ancestry are contiguous (no gap, overlap or repeat) and every
  landed file belongs to a committed batch (in the staging ledger, or named by the table's history);
- each lakehouse commit added exactly the rows it staged;
- no data file is referenced twice, and every referenced data and delete file exists.
"""

from __future__ import annotations

import json
from collections import Counter

from pyiceberg.table.snapshots import ancestors_of

from lakehouse_assets.batches.landing import landing_dir, list_landing_files
from lakehouse_assets.batches.staged_format import DELETE, OPERATION_BY_NAME
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.commit.dead_letters import dead_letter_identifier, replayed_keys
from lakehouse_assets.commit.recovery import committed_landing_files, committed_state, lakehouse_commits
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.quality import checks
from lakehouse_assets.quality.duck import iceberg_connection, manifest_entries, read_storage_of, scan


def _landed_events(lake: Lakehouse, stream: str) -> list[dict]:
    """The stream's events in landing order; a replayed dead letter only where it was replayed."""
    directory = landing_dir(lake.paths, lake.stream(stream))
    names = [landed.name for landed in list_landing_files(directory)]
    replayed = {(key.source_file, key.source_line) for key in replayed_keys(directory, names)}
    return [
        json.loads(line)
        for name in names
        for number, line in enumerate((directory / name).read_text().splitlines(), start=1)
        if line.strip() and (name, number) not in replayed
    ]


def expected_orders(lake: Lakehouse) -> tuple[list[tuple], list[dict]]:
    """Rows ``(order_id, customer_id, amount)`` and the events that must be dead letters."""
    events = _landed_events(lake, "orders")
    good = [e for e in events if isinstance(e.get("order_id"), int)]
    return sorted((e["order_id"], e.get("customer_id"), e.get("amount")) for e in good), [
        e for e in events if not isinstance(e.get("order_id"), int)
    ]


def expected_customers(lake: Lakehouse) -> tuple[list[tuple], list[dict]]:
    """Rows ``(id, name)`` after applying the changes in landing order, and the dead letters."""
    rows: dict[int, tuple] = {}
    rejected = []
    for event in _landed_events(lake, "customers"):
        operation = OPERATION_BY_NAME.get(str(event.get("op", "")).lower())
        if operation is None:
            rejected.append(event)
        elif operation == DELETE:
            rows.pop(event["id"], None)
        else:
            rows[event["id"]] = (event["id"], event.get("name"))
    return sorted(rows.values()), rejected


def _rows(lake: Lakehouse, identifier: str, columns: str) -> list[tuple]:
    location = lake.metadata_location(identifier)
    table = lake.table(identifier)
    if table is None or table.current_snapshot() is None:
        return []
    query = f"SELECT {columns} FROM {scan(location, table.current_snapshot().snapshot_id)} ORDER BY ALL"
    return iceberg_connection().sql(query).fetchall()


def _pyiceberg_rows(lake: Lakehouse, identifier: str, columns: list[str]) -> list[tuple]:
    table = lake.table(identifier)
    arrow = table.scan(selected_fields=tuple(columns)).to_arrow()
    return sorted(zip(*[arrow.column(name).to_pylist() for name in columns], strict=True))


def _table_problems(lake: Lakehouse, identifier: str) -> list[str]:
    problems = []
    table = lake.table(identifier)
    location = lake.metadata_location(identifier)
    snapshot = checks.CommittedSnapshot(location, table.current_snapshot().snapshot_id, lake.file_io_properties)
    connection = iceberg_connection()
    for outcome in (checks.check_sequence_ranges(snapshot), checks.check_unique_data_files(connection, snapshot)):
        if not outcome.passed:
            problems.append(f"{identifier}: {outcome.description}")
    files = connection.sql(f"SELECT DISTINCT file_path FROM {manifest_entries(location, snapshot.snapshot_id)}")
    missing = [path for (path,) in files.fetchall() if not table.io.new_input(path).exists()]
    if missing:
        problems.append(f"{identifier}: {len(missing)} referenced files do not exist, e.g. {missing[0]}")
    for ancestor in ancestors_of(table.current_snapshot(), table.metadata):
        summary = ancestor.summary.additional_properties
        if summary_keys.STREAM in summary and summary.get("added-records", "0") != summary[summary_keys.ROWS]:
            problems.append(
                f"{identifier}: snapshot {ancestor.snapshot_id} added {summary.get('added-records')} rows "
                f"but staged {summary[summary_keys.ROWS]}"
            )
    return problems


FAULT_PIPELINE_TABLES = ("sales.orders", "crm.customers")


def invariant_violations(lake: Lakehouse) -> list[str]:
    """Every violated invariant, described; empty when the pipeline did exactly-once."""
    read_storage_of(lake.config.catalog)
    problems = []
    orders, orders_rejected = expected_orders(lake)
    customers, customers_rejected = expected_customers(lake)
    tables = {
        "sales.orders": (orders, orders_rejected, ["order_id", "customer_id", "amount"]),
        "crm.customers": (customers, customers_rejected, ["id", "name"]),
    }
    for identifier, (expected, rejected, columns) in tables.items():
        actual = _rows(lake, identifier, ", ".join(columns))
        if actual != expected:
            extra = Counter(actual) - Counter(expected)
            lost = Counter(expected) - Counter(actual)
            problems.append(
                f"{identifier}: {sum(extra.values())} unexpected or duplicated rows (e.g. {list(extra)[:3]}), "
                f"{sum(lost.values())} missing (e.g. {list(lost)[:3]})"
            )
        if _pyiceberg_rows(lake, identifier, columns) != actual:
            problems.append(f"{identifier}: PyIceberg and DuckDB read different rows")
        problems.extend(_table_problems(lake, identifier))
        dead = Counter(
            json.dumps(json.loads(event), sort_keys=True)
            for (event,) in _rows(lake, dead_letter_identifier(identifier), "event")
        )
        wanted = Counter(json.dumps(event, sort_keys=True) for event in rejected)
        if dead != wanted:
            problems.append(f"{identifier}: dead letters {dict(dead)} differ from the rejected events {dict(wanted)}")
    keys = _rows(lake, "crm.customers", "id")
    if len(keys) != len(set(keys)):
        problems.append("crm.customers: an identifier key appears twice")
    for stream in lake.config.streams:
        ledger = lake.ledger(stream.name)
        table = lake.table(stream.table_identifier)
        committed = committed_state(table, stream.name).sequence
        claimed = {name for record in ledger.batches() if record.sequence <= committed for name in record.minted.files}
        claimed |= committed_landing_files(table, stream.name)
        unclaimed = [f.name for f in list_landing_files(landing_dir(lake.paths, stream)) if f.name not in claimed]
        if unclaimed:
            problems.append(f"stream {stream.name}: {len(unclaimed)} landed files are not in a committed batch")
    return problems


def each_batch_committed_once(lake: Lakehouse, identifier: str) -> bool:
    """Whether the table's commits name every batch of each stream once, in order."""
    batches = [
        (commit.stream, sequence)
        for commit in lakehouse_commits(lake.table(identifier))
        for sequence in range(commit.first_sequence, commit.last_sequence + 1)
    ]
    return batches == sorted(set(batches))


def assert_every_batch_once(lake: Lakehouse) -> None:
    """The fault pipeline's tables against the landing oracle (DuckDB and PyIceberg), and each
    batch once in each table and in its dead-letter table."""
    assert invariant_violations(lake) == []
    for identifier in FAULT_PIPELINE_TABLES:
        assert each_batch_committed_once(lake, identifier), identifier
        assert each_batch_committed_once(lake, dead_letter_identifier(identifier)), identifier
