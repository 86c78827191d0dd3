"""Snapshot-summary keys every lakehouse commit carries (a contract: extend, don't rename)."""

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
