"""The tables one router feeds, worked on together (fan-in): which have routes to commit, staging
their routes (``routed_staging``) and committing them, two tables at a time.

Each table keeps its own commit: ``committer.commit_table`` with its lock, fence, summary keys and
recovery. Only the scheduling is shared: one process, one Spark session, and commits of different
tables in flight at once. A small table's commit is mostly waiting (planning, catalog and metadata
I/O, a one-task Spark job), so two at a time keep both cores busy; a failing table is returned
with its error and does not stop the others.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from pyspark.sql import SparkSession

from lakehouse_assets.batch_ledger import StreamLedger
from lakehouse_assets.committer import CommitPass, CommitResult, commit_table
from lakehouse_assets.config import LakehouseConfig, StreamSpec, routed_stream_name
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.landing import list_landing_files
from lakehouse_assets.micro_batching import mint_next_batch
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.routed_staging import PendingBatch, stage_routed_batches
from lakehouse_assets.routing import route_file

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
        routes = list_landing_files(route_file(paths, router.name, table, 0).parent)
        last_batched = max(latest.minted.files, default="") if latest else ""
        unbatched = bool(routes) and routes[-1].name > last_batched
        if unbatched or (latest is not None and latest.committed is None):
            pending.append(table)
    return pending


def stage_routed_tables(
    spark: SparkSession,
    config: LakehouseConfig,
    paths: LakehousePaths,
    router: StreamSpec,
    tables: list[str],
    run_id: str,
) -> dict[str, str]:
    """Mint every route file of ``tables`` not in a batch yet and stage every unstaged batch of
    theirs, in one Spark session and one Spark job per table schema (``routed_staging``); ``config``
    must hold their derived streams (``LakehouseConfig.with_routes``). Harmless to repeat. Returns
    the tables that could not be staged, with the error; the others are staged."""
    pending: list[PendingBatch] = []
    for table in tables:
        stream = config.stream(routed_stream_name(router.name, table))
        while mint_next_batch(config, paths, stream, drain=True)[0] is not None:
            pass
        records = StreamLedger(paths.staging(stream.name)).batches()
        pending.extend(PendingBatch(stream, record) for record in records if record.staged is None)
    return stage_routed_batches(spark, config, paths, router, pending, run_id)


def commit_new_routes(
    spark: SparkSession,
    config: LakehouseConfig,
    paths: LakehousePaths,
    router: StreamSpec,
    tables: list[str],
    run_id: str,
) -> list[CommitResult]:
    """Stage and commit every route to ``tables``, routed tables that have no committer of their
    own yet; the derived streams' ledgers, locks and fencing make this safe next to any other
    committer. Returns the commits; raises LakehouseError naming the tables that could not be staged."""
    failed: dict[str, str | LakehouseError] = {**stage_routed_tables(spark, config, paths, router, tables, run_id)}
    commits = commit_tables(spark, config, paths, tables, run_id)
    failed.update((table, outcome) for table, outcome in commits.items() if isinstance(outcome, LakehouseError))
    if failed:
        raise LakehouseError("; ".join(f"{table}: {error}" for table, error in failed.items()))
    return [result for outcome in commits.values() for result in outcome.results]


def commit_tables(
    spark: SparkSession, config: LakehouseConfig, paths: LakehousePaths, tables: list[str], run_id: str
) -> dict[str, CommitPass | LakehouseError]:
    """Commit each table's ready batches, ``CONCURRENT_COMMITS`` tables at a time; a table whose
    commit raised maps to its error (a SequenceGapError as raised, anything else as a
    LakehouseError naming it), so one table never stops the others."""

    def commit(table: str) -> CommitPass | LakehouseError:
        try:
            return commit_table(spark, config, paths, table, run_id)
        except LakehouseError as error:
            return error
        except Exception as error:  # noqa: BLE001 - reported on the table; Spark's errors do not pickle
            return LakehouseError(f"{type(error).__name__}: {error}")

    with ThreadPoolExecutor(CONCURRENT_COMMITS, thread_name_prefix="lakehouse-commit") as pool:
        return dict(zip(tables, pool.map(commit, tables), strict=True))
