"""The tables one router feeds, worked on together (fan-in): which have routes to commit, staging
their routes (``routed_staging``) and committing them, two tables at a time.

Each table keeps its own commit: ``table_commits.commit_table`` with its lock, fence, summary keys and
recovery. Only the scheduling is shared: one process, one Spark session, and commits of different
tables in flight at once. A small table's commit is mostly waiting (planning, catalog and metadata
I/O, a one-task Spark job), so two at a time keep both cores busy; a failing table is returned
with its error and does not stop the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from functools import partial

from pyspark.sql import SparkSession

from lakehouse_assets.batches.landing import list_landing_files
from lakehouse_assets.batches.ledger import STAGED_FILE, StreamLedger
from lakehouse_assets.commit.committer import CommitOutcome
from lakehouse_assets.config.routed_streams import routed_stream_name
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.errors import describe_error
from lakehouse_assets.ingest.micro_batching import mint_next_batch
from lakehouse_assets.ingest.routed_staging import PendingBatch, stage_routed_batches
from lakehouse_assets.ingest.routing import route_dir
from lakehouse_assets.ingest.table_commits import commit_table
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.paths import LakehousePaths

CONCURRENT_COMMITS = 2
"""Tables committed at once; each commit still holds its own table's lock."""


def tables_with_pending_routes(paths: LakehousePaths, router: StreamSpec, tables: list[str]) -> list[str]:
    """The routed tables a committer has work for: a route file newer than the table's latest
    batch, or a latest batch whose commit is not recorded (not staged, staged, or committed by a
    pass that died before recording it). Reads one ledger record and one directory per table:
    route files are named by the router's batch sequence and batched and committed in that order."""
    pending = []
    for table in tables:
        latest = StreamLedger(paths.staging(routed_stream_name(router.name, table))).latest()
        routes = list_landing_files(route_dir(paths, router.name, table))
        last_batched = max(latest.minted.files, default="") if latest else ""
        unbatched = bool(routes) and routes[-1].name > last_batched
        if unbatched or (latest is not None and latest.committed is None):
            pending.append(table)
    return pending


def stage_routed_tables(
    spark: SparkSession,
    lake: Lakehouse,
    router: StreamSpec,
    tables: list[str],
    run_id: str,
) -> dict[str, str]:
    """Mint every route file of ``tables`` not in a batch yet and stage every unstaged batch of
    theirs, in one Spark session and one Spark job per table schema (``routed_staging``); ``config``
    must hold their derived streams (``routed_streams.with_routes``). Harmless to repeat. Returns
    the tables that could not be staged, with the error; the others are staged."""
    pending: list[PendingBatch] = []
    for table in tables:
        stream = lake.stream(routed_stream_name(router.name, table))
        while mint_next_batch(lake, stream, drain=True)[0] is not None:
            pass
        records = lake.ledger(stream.name).batches(lacking=STAGED_FILE)
        pending.extend(PendingBatch(stream, record) for record in records if record.staged is None)
    return stage_routed_batches(spark, lake, router, pending, run_id)


@dataclass(frozen=True)
class NewRoutes:
    """What committing new routed tables did: each table's committer pass, and the tables that
    failed, with why."""

    outcomes: dict[str, CommitOutcome]
    failed: dict[str, str]


def commit_new_routes(
    spark: SparkSession,
    lake: Lakehouse,
    router: StreamSpec,
    tables: list[str],
    run_id: str,
) -> NewRoutes:
    """Stage and commit every route to ``tables``, routed tables that have no committer of their
    own yet; the derived streams' ledgers, locks and fencing make this safe next to any other
    committer. A table that cannot be staged or committed holds back no other."""
    failed = stage_routed_tables(spark, lake, router, tables, run_id)
    outcomes: dict[str, CommitOutcome] = {}
    commit = partial(commit_table, spark, lake, run_id=run_id)
    for table, outcome in commit_concurrently(commit, [table for table in tables if table not in failed]):
        if isinstance(outcome, Exception):
            failed[table] = describe_error(outcome)
        else:
            outcomes[table] = outcome
    return NewRoutes(outcomes, failed)


def commit_concurrently(
    commit: Callable[[str], CommitOutcome], tables: list[str]
) -> Iterator[tuple[str, CommitOutcome | Exception]]:
    """``commit(table)`` for each table, ``CONCURRENT_COMMITS`` at a time, yielding each table's
    pass as soon as it is done (so it is reported before the others finish), or the exception it
    raised: one table's failure never stops the others. A single table is committed on the
    calling thread, where an interrupt (its run terminated) reaches it."""
    if len(tables) == 1:
        outcome: CommitOutcome | Exception
        try:
            outcome = commit(tables[0])
        except Exception as failure:  # noqa: BLE001 - the table's failure, reported by the caller
            outcome = failure
        yield tables[0], outcome
        return
    with ThreadPoolExecutor(CONCURRENT_COMMITS, thread_name_prefix="lakehouse-commit") as pool:
        futures = {pool.submit(commit, table): table for table in tables}
        for future in as_completed(futures):
            error = future.exception()
            if error is not None and not isinstance(error, Exception):
                raise error  # an interrupt, not a table's failure
            yield futures[future], error if error is not None else future.result()
