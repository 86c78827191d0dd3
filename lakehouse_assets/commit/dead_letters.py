"""The dead-letter table next to each table: rejected events with the reason and where they came from."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import partial, reduce
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakehouse_assets.batches.landing import landing_dir
from lakehouse_assets.batches.ledger import BatchRecord
from lakehouse_assets.batches.staged_rows import read_staged, rejected_events
from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.commit.fenced_pass import DEAD_LETTER_WRITE, CommitTarget, CommitterPass, write_until_landed
from lakehouse_assets.commit.pass_branches import abandoned_pass_branches, drop_pass_branch, written_on_pass_branch
from lakehouse_assets.commit.recovery import MAIN_BRANCH, committed_state
from lakehouse_assets.commit.table_writes import append_rows, run_with_commit_properties
from lakehouse_assets.commit.tables import MANAGED_TABLE_PROPERTIES
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.engine.local_rows import rows_frame
from lakehouse_assets.lakehouse import Lakehouse

DEAD_LETTER_SUFFIX = "_dead_letters"
SIDECAR_SUFFIX = ".replay.json"
KEY_COLUMNS = ("stream", "batch_sequence", "source_file", "source_line")
DEAD_LETTER_COLUMNS = ("event", "reason", "stream", "batch_sequence", "source_file", "source_line", "recorded_at")


@dataclass(frozen=True)
class DeadLetterKey:
    """Identifies one dead-letter row: each landing line is in exactly one batch of one stream."""

    stream: str
    batch_sequence: int
    source_file: str
    source_line: int


def sidecar_path(landing_file: Path) -> Path:
    """The sidecar of a replay landing file: the dead letters it replays (a dot-name, so it is
    never taken for events)."""
    return landing_file.with_name(f".{landing_file.name}{SIDECAR_SUFFIX}")


def replayed_keys(directory: Path, files: list[str]) -> list[DeadLetterKey]:
    """The dead-letter rows that the given landing files replay (none for ordinary files)."""
    keys: list[DeadLetterKey] = []
    for name in files:
        sidecar = sidecar_path(directory / name)
        if sidecar.exists():
            keys.extend(DeadLetterKey(**entry) for entry in json.loads(sidecar.read_text()))
    return keys


def dead_letter_identifier(table_identifier: str) -> str:
    """The dead-letter table that sits next to a table: ``<namespace>.<table>_dead_letters``."""
    return f"{table_identifier}{DEAD_LETTER_SUFFIX}"


def stream_dead_letter_identifier(stream: StreamSpec) -> str:
    """Where a stream's rejected events go: next to its table, or the router's own table."""
    return stream.router_dead_letter_identifier if stream.is_router else dead_letter_identifier(stream.table_identifier)


def ensure_dead_letter_table(spark: SparkSession, identifier: str) -> None:
    """Create the dead-letter table if needed (format v2, Iceberg's own commit retry off)."""
    properties = ", ".join(f"'{k}' = '{v}'" for k, v in {"format-version": "2", **MANAGED_TABLE_PROPERTIES}.items())
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {qualified_name(identifier.rsplit('.', 1)[0])}")
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {qualified_name(identifier)} ("
        "event string, reason string, stream string, batch_sequence bigint, source_file string, "
        f"source_line bigint, recorded_at timestamp) USING iceberg TBLPROPERTIES ({properties})"
    )


def dead_letter_rows(spark: SparkSession, stream: str, batches: list[BatchRecord]) -> DataFrame:
    """The rejected events of staged batches, as rows of the dead-letter table."""
    frames = [
        rejected_events(read_staged(spark, record.events_path())).select(
            "event",
            "reason",
            F.lit(stream).alias("stream"),
            F.lit(record.sequence).cast("bigint").alias("batch_sequence"),
            "source_file",
            "source_line",
            F.current_timestamp().alias("recorded_at"),
        )
        for record in batches
    ]
    return reduce(DataFrame.unionByName, frames)


def replace_dead_letters(
    spark: SparkSession,
    identifier: str,
    new_rows: DataFrame | None,
    replayed: list[DeadLetterKey],
    properties: dict[str, str],
    view_name: str,
    branch: str | None = None,
) -> None:
    """In one commit (to the table or its ``branch``), delete the replayed dead-letter rows and add
    ``new_rows`` (events that failed again, with their new reason), carrying ``properties`` in the
    snapshot summary."""
    keys = rows_frame(
        spark,
        [asdict(key) for key in replayed],
        "event string, reason string, stream string, batch_sequence bigint, source_file string, "
        "source_line bigint, recorded_at timestamp",
    ).select("*", F.lit("delete").alias("_action"))
    if new_rows is not None:
        keys = keys.unionByName(new_rows.select(*DEAD_LETTER_COLUMNS, F.lit("insert").alias("_action")))
    keys.createOrReplaceTempView(view_name)
    match = " AND ".join(
        f"t.{column} = s.{column}" for column in ("stream", "batch_sequence", "source_file", "source_line")
    )
    statement = (
        f"MERGE INTO {qualified_name(identifier, branch)} t USING {view_name} s ON s._action = 'delete' AND {match} "
        "WHEN MATCHED THEN DELETE "
        f"WHEN NOT MATCHED AND s._action = 'insert' THEN INSERT ({', '.join(DEAD_LETTER_COLUMNS)}) "
        f"VALUES ({', '.join('s.' + column for column in DEAD_LETTER_COLUMNS)})"
    )
    try:
        run_with_commit_properties(spark, statement, properties)
    finally:
        spark.catalog.dropTempView(view_name)


def commit_dead_letters(
    spark: SparkSession,
    lake: Lakehouse,
    stream: StreamSpec,
    batches: list[BatchRecord],
    run_id: str,
) -> int:
    """Commit the batches' rejected events to the stream's dead-letter table, and remove the dead
    letters they replay, in one commit of a fenced pass over that table (its own epoch, the head it
    planned from, written until its ancestry shows the batches), unless the ancestry already has
    them. Returns how many events the batches rejected.

    Raises FencedError, with nothing committed, when another committer wrote the dead-letter table
    after this pass read it."""
    identifier = stream_dead_letter_identifier(stream)
    directory = landing_dir(lake.paths, stream)
    replays = {record.sequence: replayed_keys(directory, record.minted.files) for record in batches}
    count = sum(record.staged_batch.rejected for record in batches)
    if count == 0 and not any(replays.values()):
        return 0
    ensure_dead_letter_table(spark, identifier)
    dead_letters = CommitterPass.begin(spark, lake, identifier, run_id, CommitTarget.direct())
    table = dead_letters.table()
    already = committed_state(table, stream.name).sequence
    pending = [r for r in batches if r.sequence > already and (r.staged_batch.rejected or replays[r.sequence])]
    if not pending:
        return count
    rejected = [record for record in pending if record.staged_batch.rejected]
    rows = sum(record.staged_batch.rejected for record in rejected)
    properties = summary_keys.commit_summary(stream.name, pending, rows, rows, dead_letters.stamp)
    new_rows = dead_letter_rows(spark, stream.name, rejected) if rejected else None
    replayed = [key for record in pending for key in replays[record.sequence]]
    for abandoned in abandoned_pass_branches(table):
        drop_pass_branch(spark, identifier, abandoned)
    with written_on_pass_branch(
        spark, lake.config, identifier, dead_letters.expected_snapshot_id, MAIN_BRANCH, dead_letters.stamp
    ) as branch:
        writing = dead_letters.on_pass_branch(branch) if branch != MAIN_BRANCH else dead_letters
        if replayed:
            properties[summary_keys.NET_ROWS] = str(rows - len(replayed))
            view = f"lakehouse_dead_letters_{stream.name}_{pending[0].sequence}"
            write = partial(replace_dead_letters, spark, identifier, new_rows, replayed, properties, view, branch)
        else:
            assert new_rows is not None  # without replays, pending batches have rejects
            write = partial(append_rows, new_rows, identifier, properties, branch)
        write_until_landed(writing, stream.name, pending[-1].sequence, write, DEAD_LETTER_WRITE)
    return count
