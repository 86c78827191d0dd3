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
UNCOERCIBLE_VALUES = "lakehouse.uncoercible-values"
"""Per optional column, the committed events whose value could not be coerced to the column's type
and was written as NULL (a JSON object; absent when there were none)."""
SOURCE_SNAPSHOT = "lakehouse.source-snapshot"
LANDING_FILES = "lakehouse.landing-files"
"""The landing files of the commit's batches (a JSON list of names): the table's own record of
which landing files are committed, so a lost staging ledger cannot batch them again."""
KAFKA_OFFSETS = "lakehouse.kafka-offsets"
"""A Kafka stream's commit: the offset its next batch starts at in every partition (a JSON object
``{"<topic>/<partition>": offset}``), the table's own record of how far the stream has read."""
KAFKA_LOST_OFFSETS = "lakehouse.kafka-lost-offsets"
"""Offsets the commit's batches skipped because the log had deleted them (``on_records_lost: skip``)."""


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
    if batches[-1].minted.offsets:
        source = _kafka_summary(batches) | ({LANDING_FILES: json.dumps(files)} if files else {})
    else:
        # An Iceberg source's landing files are named by source snapshot, in order (replays are not).
        source_snapshots = [snapshot for name in files if (snapshot := source_snapshot_of(name))]
        source = {SOURCE_SNAPSHOT: str(source_snapshots[-1])} if source_snapshots else {}
        source |= {
            SOURCE_OFFSETS: json.dumps({"files": len(files), "first": files[0], "last": files[-1]}),
            LANDING_FILES: json.dumps(files),
        }
    event_times = [r.staged_batch.max_event_time for r in batches if r.staged_batch.max_event_time]
    return source | {
        STREAM: stream,
        COMMIT_SEQUENCE: str(batches[-1].sequence),
        BATCH_RANGE: format_batch_range(batches[0].sequence, batches[-1].sequence),
        ROWS: str(rows),
        NET_ROWS: str(net_rows),
        MAX_EVENT_TIME: max(event_times) if event_times else "",
        COMMITTER_EPOCH: str(stamp.epoch),
        COMMITTER_RUN: stamp.run_id,
    }


def _kafka_summary(batches: list[BatchRecord]) -> dict[str, str]:
    """A Kafka stream's commit: the offsets it reached, the ranges it covers, what it skipped."""
    first = batches[0].minted.offsets
    reached = batches[-1].minted.end_offsets
    covered = {name: [first[name][0] if name in first else end, end] for name, end in reached.items()}
    lost: dict[str, list[list[int]]] = {}
    for record in batches:
        for name, bounds in record.staged_batch.lost_offsets.items():
            lost.setdefault(name, []).append(bounds)
    summary = {KAFKA_OFFSETS: json.dumps(reached, sort_keys=True), SOURCE_OFFSETS: json.dumps(covered, sort_keys=True)}
    return summary | ({KAFKA_LOST_OFFSETS: json.dumps(lost, sort_keys=True)} if lost else {})
