"""Dynamic routing: a stream whose ``table_identifier`` is an expression over each event.

The router is a fan-out in front of ordinary streams. It reads each minted batch of the routing
stream, resolves every event's table, and publishes the events of each table, in landing order, as
one file ``routes/<stream>/<table>/<sequence>.ndjson``. Each such directory is the landing
directory of a derived stream (``routed_streams.with_routes``) with its own staging ledger,
commit sequence, table and checks, so everything after routing is the pipeline every stream uses.

Exactly once: one attempt wins a batch (``staged.json``, as for any batch); its route files have
names fixed by the batch sequence and are published with exclusive hard links, so a repeated run
publishes nothing twice; events that cannot be routed go to the router's dead-letter table in a
commit whose summary names the batch, so a repeated run does not add them again. Batches are routed
in sequence order under a lock, so each table receives its events in landing order, which change
streams need.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import landing_dir
from lakehouse_assets.batches.ledger import (
    COMMITTED_FILE,
    EVENTS_DIR,
    BatchRecord,
    CommittedBatch,
    StagedBatch,
    StreamLedger,
)
from lakehouse_assets.batches.staged_format import EVENT_COLUMN, LINE_COLUMN, REASON_COLUMN, SOURCE_FILE_COLUMN
from lakehouse_assets.commit.dead_letters import DEAD_LETTER_SUFFIX, commit_dead_letters, sidecar_path
from lakehouse_assets.commit.recovery import branch_head_id
from lakehouse_assets.config.routed_streams import ROUTED_TABLE
from lakehouse_assets.config.spec import ROUTER_DEAD_LETTER_NAMESPACE, TEMPLATE_POINTER, StreamSpec
from lakehouse_assets.faults import crash_point
from lakehouse_assets.ingest.landing_reader import read_landing_lines, valid_text
from lakehouse_assets.ingest.staging import input_links, landing_files, minted_record
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.locks import exclusive_lock, stream_lock_file, table_lock_file
from lakehouse_assets.paths import LakehousePaths

ROUTE_COLUMN = "_lakehouse_route"
ROUTES_DIR = "routes"
ROUTED_IDENTIFIER = f"^{ROUTED_TABLE}\\z"
"""The routed-table grammar (``routed_streams.ROUTED_TABLE``) as a Java regular expression for ``rlike``."""


@dataclass(frozen=True)
class RoutedBatch:
    """One routed batch: events per resolved table, events sent to the dead letters, and whether
    this call routed it (False: an earlier run had)."""

    sequence: int
    routes: dict[str, int]
    rejected: int
    routed_now: bool


def route_column(template: str) -> Column:
    """The table each event names: the template with each ``${/pointer}`` replaced by the event's
    field (NULL when a field is missing), lower-cased."""
    parts: list[Column] = []
    position = 0
    for match in TEMPLATE_POINTER.finditer(template):
        if match.start() > position:
            parts.append(F.lit(template[position : match.start()]))
        path = "$" + "".join(f"['{token}']" for token in match.group(1).split("/")[1:])
        parts.append(F.get_json_object(F.col(EVENT_COLUMN), path))
        position = match.end()
    if position < len(template):
        parts.append(F.lit(template[position:]))
    return F.lower(F.concat(*parts))


def _rejection_reason(template: str, missing_tables: list[str]) -> Column:
    """Why an event cannot be routed, or NULL: the dead-letter reasons of routing."""
    route = F.col(ROUTE_COLUMN)
    prefix = f"table_identifier {template}: "
    reserved = (
        route.contains("__") | route.endswith(DEAD_LETTER_SUFFIX) | route.startswith(ROUTER_DEAD_LETTER_NAMESPACE + ".")
    )
    return (
        F.when(F.get_json_object(F.col(EVENT_COLUMN), "$").isNull(), F.lit("not a JSON object"))
        .when(route.isNull(), F.lit(prefix + "a field it points to is missing or null"))
        .when(~route.rlike(ROUTED_IDENTIFIER), F.concat(F.lit(prefix + "'"), route, F.lit("' is not namespace.table")))
        .when(
            reserved,
            F.concat(
                F.lit(prefix + "'"),
                route,
                F.lit(f"' is reserved ('__' in a name, a dead-letter table, namespace {ROUTER_DEAD_LETTER_NAMESPACE})"),
            ),
        )
        .when(
            route.isin(missing_tables) if missing_tables else F.lit(False),
            F.concat(F.lit(prefix + "table "), route, F.lit(" does not exist and auto_create is false")),
        )
    )


def route_dir(paths: LakehousePaths, stream: str, table_identifier: str) -> Path:
    """Where a router publishes the events it routes to ``table_identifier``: the landing directory
    of the table's derived stream."""
    return paths.routes / stream / table_identifier


def route_file(paths: LakehousePaths, stream: str, table_identifier: str, sequence: int) -> Path:
    """Where batch ``sequence`` of a router publishes the events it routed to ``table_identifier``."""
    return route_dir(paths, stream, table_identifier) / f"{sequence:010d}.ndjson"


def _write_route_files(events_dir: Path, routes_dir: Path) -> tuple[dict[str, int], int]:
    """Split the staged events that have a table into one NDJSON file per table, in landing order;
    returns the events per table and the number of events without one."""
    staged = pq.read_table(
        events_dir, columns=[EVENT_COLUMN, SOURCE_FILE_COLUMN, LINE_COLUMN, ROUTE_COLUMN, REASON_COLUMN]
    )
    routed = staged.filter(pc.is_null(staged[REASON_COLUMN])).sort_by(
        [(ROUTE_COLUMN, "ascending"), (SOURCE_FILE_COLUMN, "ascending"), (LINE_COLUMN, "ascending")]
    )
    routes_dir.mkdir(parents=True)
    counts = {}
    for table in pc.unique(routed[ROUTE_COLUMN]).to_pylist():
        events = routed.filter(pc.equal(routed[ROUTE_COLUMN], table))[EVENT_COLUMN].to_pylist()
        with open(routes_dir / f"{table}.ndjson", "w") as handle:
            handle.writelines(event + "\n" for event in events)
            handle.flush()
            os.fsync(handle.fileno())
        counts[table] = len(events)
    return counts, staged.num_rows - routed.num_rows


def _stage_routes(
    spark: SparkSession,
    lake: Lakehouse,
    stream: StreamSpec,
    ledger: StreamLedger,
    record: BatchRecord,
    run_id: str | None,
) -> BatchRecord:
    """Resolve every event's table and write the attempt's route files; the winning attempt's record."""
    lines = read_landing_lines(spark, landing_files(lake.paths, stream, record), input_links(record)).withColumn(
        ROUTE_COLUMN, route_column(stream.table_identifier)
    )
    missing: list[str] = []
    if not stream.auto_create:
        resolved = lines.where(F.col(ROUTE_COLUMN).rlike(ROUTED_IDENTIFIER)).select(ROUTE_COLUMN).distinct()
        tables = [row[0] for row in resolved.collect()]
        missing = [table for table in tables if lake.metadata_location(table) is None]
    attempt, attempt_dir = ledger.new_attempt(record.sequence)
    staged = lines.withColumn(REASON_COLUMN, _rejection_reason(stream.table_identifier, missing))
    staged.withColumn(EVENT_COLUMN, valid_text(F.col(EVENT_COLUMN))).write.parquet(str(attempt_dir / EVENTS_DIR))
    routes, rejected = _write_route_files(attempt_dir / EVENTS_DIR, attempt_dir / ROUTES_DIR)
    outcome = StagedBatch(
        sequence=record.sequence,
        attempt=attempt,
        rows=sum(routes.values()),
        rejected=rejected,
        min_event_time=None,
        max_event_time=None,
        staged_at=time.time(),
        run_id=run_id,
        routes=routes,
    )
    if not ledger.record_staged(outcome):
        ledger.remove_attempts(record.sequence, keep=ledger.require(record.sequence).staged_batch.attempt)
    return ledger.require(record.sequence)


def _publish_routes(paths: LakehousePaths, stream: StreamSpec, record: BatchRecord) -> None:
    """Link the batch's route files into the route directories; a file already there is kept."""
    for table in sorted(record.staged_batch.routes):
        target = route_file(paths, stream.name, table, record.sequence)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(record.events_path().parent / ROUTES_DIR / f"{table}.ndjson", target)
        except FileExistsError:
            pass
        crash_point(faults.ROUTER_DURING_PUBLISH)


def _commit_unroutable(
    spark: SparkSession,
    lake: Lakehouse,
    stream: StreamSpec,
    record: BatchRecord,
    run_id: str,
) -> int | None:
    """Commit the batch's unroutable events (and remove the dead letters it replays) to the router's
    dead-letter table, unless its ancestry has the batch; returns the table's snapshot."""
    identifier = stream.router_dead_letter_identifier
    with exclusive_lock(table_lock_file(lake.paths.locks, identifier)):
        commit_dead_letters(spark, lake, stream, [record], run_id)
        return branch_head_id(lake.table(identifier))


def route_batches(
    spark: SparkSession,
    lake: Lakehouse,
    stream: StreamSpec,
    up_to: int,
    run_id: str,
) -> list[RoutedBatch]:
    """Route every batch of ``stream`` up to ``up_to`` that is not routed yet, in sequence order;
    harmless to repeat. Raises LakehouseError as staging does (batch never minted, landing file gone)."""
    ledger = lake.ledger(stream.name)
    routed = []
    with exclusive_lock(stream_lock_file(lake.paths.locks, f"{stream.name}-router")):
        for candidate in ledger.batches(lacking=COMMITTED_FILE):
            if candidate.sequence > up_to:
                break
            record = minted_record(ledger, stream, candidate.sequence, None)
            if record.committed:
                continue
            routed_now = record.staged is None
            if routed_now:
                record = _stage_routes(spark, lake, stream, ledger, record, run_id)
            _publish_routes(lake.paths, stream, record)
            snapshot_id = _commit_unroutable(spark, lake, stream, record, run_id)
            crash_point(faults.ROUTER_AFTER_DEAD_LETTERS)
            ledger.record_committed(record.sequence, CommittedBatch(snapshot_id or 0, record.sequence, time.time()))
            ledger.remove_attempts(record.sequence)
            routed.append(
                RoutedBatch(record.sequence, record.staged_batch.routes, record.staged_batch.rejected, routed_now)
            )
        _remove_routed_landing_files(lake.paths, stream, ledger)
    return routed


def _remove_routed_landing_files(paths: LakehousePaths, stream: StreamSpec, ledger: StreamLedger) -> None:
    """Remove the landing files of batches routed ``maintenance.landing_retention`` ago or longer,
    and their ledger entries: each of their events is in a route file or in the dead-letter table.
    The highest entry stays: a router commits no table of its own that would keep its sequence, and
    the next batch (and the names of its route files) must continue after it."""
    directory = landing_dir(paths, stream)
    now = time.time()
    ledger.sweep_removed()
    records = ledger.batches()
    for record in records:
        if record.committed and now - record.committed.committed_at >= stream.maintenance.landing_retention:
            for name in record.minted.files:
                (directory / name).unlink(missing_ok=True)
                sidecar_path(directory / name).unlink(missing_ok=True)
            if record is not records[-1]:
                ledger.remove_batch(record.sequence)
