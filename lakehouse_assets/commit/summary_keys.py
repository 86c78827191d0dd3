"""Snapshot-summary keys every lakehouse commit carries (a contract: extend, don't rename), and
the summary of one commit of a stream's batches."""

from __future__ import annotations

import json
from dataclasses import dataclass

from lakehouse_assets.batches.landing import source_snapshot_of
from lakehouse_assets.batches.ledger import BatchRecord

PREFIX = "lakehouse."
STREAM = "lakehouse.stream"
COMMIT_SEQUENCE = "lakehouse.commit-sequence"
BATCH_RANGE = "lakehouse.batch-range"
ROWS = "lakehouse.rows"
NET_ROWS = "lakehouse.net-rows"
INSERTED = "lakehouse.inserted"
UPDATED = "lakehouse.updated"
DELETED = "lakehouse.deleted"
STALE_CHANGES = "lakehouse.stale-changes"
SOURCE_OFFSETS = "lakehouse.source-offsets"
MAX_EVENT_TIME = "lakehouse.max-event-time"
COMMITTER_EPOCH = "lakehouse.committer-epoch"
COMMITTER_RUN = "lakehouse.committer-run"
WATERMARK = "lakehouse.watermark"
LATE_EVENTS = "lakehouse.late-events"
SCHEMA_CHANGE = "lakehouse.schema-change"
SCHEMA_CHANGE_BATCHES = "lakehouse.schema-change-batches"
SOURCE_SNAPSHOT = "lakehouse.source-snapshot"
LANDING_FILES = "lakehouse.landing-files"
"""The landing files of the commit's batches (a JSON list of names): the table's own record of
which landing files are committed, so a lost staging ledger cannot batch them again."""


def format_batch_range(first: int, last: int) -> str:
    return f"{first}-{last}"


def parse_batch_range(value: str) -> tuple[int, int]:
    first, _, last = value.partition("-")
    return int(first), int(last)


@dataclass(frozen=True)
class CommitStamp:
    """Who commits: an epoch above every committer epoch in the ancestry, and the run."""

    epoch: int
    run_id: str


def commit_summary(
    stream: str, batches: list[BatchRecord], rows: int, net_rows: int, stamp: CommitStamp
) -> dict[str, str]:
    """The ``lakehouse.*`` keys of one commit of ``stream``'s ``batches`` (in sequence order)."""
    files = [name for record in batches for name in record.minted.files]
    event_times = [r.staged_batch.max_event_time for r in batches if r.staged_batch.max_event_time]
    # An Iceberg source's landing files are named by source snapshot, in order (replays are not).
    source_snapshots = [snapshot for name in files if (snapshot := source_snapshot_of(name))]
    source = {SOURCE_SNAPSHOT: str(source_snapshots[-1])} if source_snapshots else {}
    return source | {
        STREAM: stream,
        COMMIT_SEQUENCE: str(batches[-1].sequence),
        BATCH_RANGE: format_batch_range(batches[0].sequence, batches[-1].sequence),
        ROWS: str(rows),
        NET_ROWS: str(net_rows),
        SOURCE_OFFSETS: json.dumps({"files": len(files), "first": files[0], "last": files[-1]}),
        LANDING_FILES: json.dumps(files),
        MAX_EVENT_TIME: max(event_times) if event_times else "",
        COMMITTER_EPOCH: str(stamp.epoch),
        COMMITTER_RUN: stamp.run_id,
    }
