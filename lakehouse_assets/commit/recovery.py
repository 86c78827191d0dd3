"""What is committed, derived only from the table's current snapshot ancestry.

The committer never trusts a cursor, a local file or a Dagster run for this: it walks parent
pointers from the current snapshot (not all snapshots, so a rollback re-commits what it removed)
and reads the ``lakehouse.*`` keys each commit wrote atomically with its data.

``expire_snapshots`` cuts the ancestry. Before it does, maintenance writes a checkpoint (the
table property ``lakehouse.checkpoint``) holding what the commits up to the oldest snapshot it
keeps added; the walk stops at that snapshot and starts from the checkpoint. An ancestry cut
anywhere else cannot be read safely, and says so instead of guessing.

Each commit also names its batches' landing files (``lakehouse.landing-files``), and the
checkpoint carries those of the commits it covers that are still in the landing zone, so the
table alone tells which landing files are committed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from lakehouse_assets.commit import summary_keys
from lakehouse_assets.errors import TruncatedAncestryError

CHECKPOINT_PROPERTY = "lakehouse.checkpoint"
MAIN_BRANCH = "main"
AUDIT_BRANCH = "audit"


@dataclass(frozen=True)
class LakehouseCommit:
    """One lakehouse commit found in the ancestry."""

    snapshot_id: int
    stream: str
    first_sequence: int
    last_sequence: int
    rows: int
    net_rows: int
    epoch: int
    run: str
    timestamp_ms: int
    watermark: str | None = None
    landing_files: tuple[str, ...] = ()
    kafka_offsets: dict[str, int] = field(default_factory=dict)
    uncoercible_values: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CommittedState:
    """The highest committed batch of a stream and the table's newest committer epoch."""

    sequence: int
    snapshot_id: int | None
    epoch: int


@dataclass(frozen=True)
class Checkpoint:
    """What the lakehouse commits up to and including one snapshot added, kept when they expire."""

    snapshot_id: int
    sequences: dict[str, int] = field(default_factory=dict)
    net_rows: int = 0
    epoch: int = 0
    watermarks: dict[str, str] = field(default_factory=dict)
    landing_files: dict[str, list[str]] = field(default_factory=dict)
    """Per stream, landing files of the covered commits (maintenance keeps those still landed)."""
    kafka_offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per Kafka stream, the offsets its commits reached in each partition."""

    def to_json(self) -> str:
        fields = {"snapshot-id": self.snapshot_id, "sequences": self.sequences, "watermarks": self.watermarks}
        fields["landing-files"] = self.landing_files
        fields["kafka-offsets"] = self.kafka_offsets
        return json.dumps({**fields, "net-rows": self.net_rows, "epoch": self.epoch}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Checkpoint:
        value = json.loads(text)
        return cls(
            value["snapshot-id"],
            value["sequences"],
            value["net-rows"],
            value["epoch"],
            value.get("watermarks", {}),
            value.get("landing-files", {}),
            value.get("kafka-offsets", {}),
        )


@dataclass(frozen=True)
class CommitHistory:
    """The ancestry of one snapshot, oldest first: a checkpoint for the part that may have expired,
    then the snapshots after it and the lakehouse commits among them."""

    base: Checkpoint | None
    snapshots: list[Snapshot]

    @property
    def commits(self) -> list[LakehouseCommit]:
        return [commit for commit in map(_as_commit, self.snapshots) if commit is not None]

    def base_sequence(self, stream: str) -> int:
        """The stream's sequence carried by the checkpoint, 0 if none."""
        return self.base.sequences.get(stream, 0) if self.base else 0

    def sequence(self, stream: str) -> int:
        """The stream's highest committed sequence, 0 if none."""
        return self.checkpoint_at(None).sequences.get(stream, 0)

    def landing_files(self, stream: str) -> set[str]:
        """The landing files the stream's commits in this history hold (the checkpoint's included)."""
        files = set(self.base.landing_files.get(stream, [])) if self.base else set()
        for commit in self.commits:
            if commit.stream == stream:
                files.update(commit.landing_files)
        return files

    def kafka_offsets(self, stream: str) -> dict[str, int]:
        """The offsets a Kafka stream's commits reached per partition (empty before its first)."""
        return self.checkpoint_at(None).kafka_offsets.get(stream, {})

    def watermark(self, stream: str) -> str | None:
        """The stream's event-time watermark (ISO 8601, UTC) after its last commit, if it has one."""
        return self.checkpoint_at(None).watermarks.get(stream)

    @property
    def epoch(self) -> int:
        """The newest committer epoch in the history."""
        return self.checkpoint_at(None).epoch

    @property
    def net_rows(self) -> int:
        """Rows the lakehouse commits added net (appended, or inserted minus deleted)."""
        return self.checkpoint_at(None).net_rows

    def checkpoint_at(self, snapshot_id: int | None) -> Checkpoint:
        """The checkpoint for ``snapshot_id`` (an ancestor; None for the newest): base plus commits up to it."""
        sequences = dict(self.base.sequences) if self.base else {}
        watermarks = dict(self.base.watermarks) if self.base else {}
        landing_files = {stream: list(files) for stream, files in self.base.landing_files.items()} if self.base else {}
        kafka = {stream: dict(offsets) for stream, offsets in self.base.kafka_offsets.items()} if self.base else {}
        net_rows, epoch = (self.base.net_rows, self.base.epoch) if self.base else (0, 0)
        last_id = self.base.snapshot_id if self.base else 0
        for snapshot in self.snapshots:
            commit = _as_commit(snapshot)
            if commit is not None:
                sequences[commit.stream] = max(sequences.get(commit.stream, 0), commit.last_sequence)
                net_rows += commit.net_rows
                epoch = max(epoch, commit.epoch)
                if commit.watermark:
                    watermarks[commit.stream] = max(watermarks.get(commit.stream, ""), commit.watermark)
                landing_files.setdefault(commit.stream, []).extend(commit.landing_files)
                reached = kafka.setdefault(commit.stream, {}) if commit.kafka_offsets else {}
                for name, offset in commit.kafka_offsets.items():
                    reached[name] = max(reached.get(name, offset), offset)
            last_id = snapshot.snapshot_id
            if snapshot.snapshot_id == snapshot_id:
                break
        return Checkpoint(last_id, sequences, net_rows, epoch, watermarks, landing_files, kafka)


def _as_commit(snapshot: Snapshot) -> LakehouseCommit | None:
    summary = snapshot.summary.additional_properties if snapshot.summary else {}
    if summary_keys.STREAM not in summary:
        return None
    first, last = summary_keys.parse_batch_range(summary[summary_keys.BATCH_RANGE])
    rows = int(summary.get(summary_keys.ROWS, "0"))
    return LakehouseCommit(
        snapshot_id=snapshot.snapshot_id,
        stream=summary[summary_keys.STREAM],
        first_sequence=first,
        last_sequence=last,
        rows=rows,
        net_rows=int(summary.get(summary_keys.NET_ROWS, rows)),
        epoch=int(summary.get(summary_keys.COMMITTER_EPOCH, "0")),
        run=summary.get(summary_keys.COMMITTER_RUN, ""),
        timestamp_ms=snapshot.timestamp_ms,
        watermark=summary.get(summary_keys.WATERMARK) or None,
        landing_files=tuple(json.loads(summary.get(summary_keys.LANDING_FILES, "[]"))),
        kafka_offsets=json.loads(summary.get(summary_keys.KAFKA_OFFSETS, "{}")),
        uncoercible_values=json.loads(summary.get(summary_keys.UNCOERCIBLE_VALUES, "{}")),
    )


def read_checkpoint(metadata: TableMetadata) -> Checkpoint | None:
    """The checkpoint maintenance recorded in the table's properties, if any."""
    text = metadata.properties.get(CHECKPOINT_PROPERTY)
    return Checkpoint.from_json(text) if text else None


def commit_history(metadata: TableMetadata, snapshot_id: int | None) -> CommitHistory:
    """The history of ``snapshot_id``: its ancestors back to the checkpoint or the first snapshot.

    Raises TruncatedAncestryError when the ancestry ends at an expired snapshot that no checkpoint
    covers: what was committed before it is unknown, and guessing would lose or duplicate batches.
    """
    checkpoint = read_checkpoint(metadata)
    walked: list[Snapshot] = []
    snapshot = metadata.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
    while snapshot is not None:
        if checkpoint and snapshot.snapshot_id == checkpoint.snapshot_id:
            return CommitHistory(checkpoint, walked[::-1])
        walked.append(snapshot)
        if snapshot.parent_snapshot_id is None:
            return CommitHistory(None, walked[::-1])
        parent = metadata.snapshot_by_id(snapshot.parent_snapshot_id)
        if parent is None:
            if checkpoint and snapshot.parent_snapshot_id == checkpoint.snapshot_id:
                return CommitHistory(checkpoint, walked[::-1])
            raise TruncatedAncestryError(
                f"snapshot {snapshot.snapshot_id}'s parent {snapshot.parent_snapshot_id} has expired and no "
                f"lakehouse checkpoint covers it (the checkpoint is "
                f"{checkpoint.snapshot_id if checkpoint else 'absent'}); the committed sequences before it "
                "are unknown. Expire snapshots with `lakehouse maintain`, which records a checkpoint first"
            )
        snapshot = parent
    return CommitHistory(None, [])


def branch_head(table: Table | None, branch: str = MAIN_BRANCH) -> Snapshot | None:
    """The snapshot ``branch`` points to; a branch not created yet starts where main is."""
    if table is None:
        return None
    return table.snapshot_by_name(branch) or table.current_snapshot()


def branch_head_id(table: Table | None, branch: str = MAIN_BRANCH) -> int | None:
    """The id of ``branch_head``; None for a missing or empty table."""
    head = branch_head(table, branch)
    return head.snapshot_id if head else None


def table_history(table: Table | None, branch: str = MAIN_BRANCH) -> CommitHistory:
    """The history of the branch's head (empty for a missing or empty table)."""
    head = branch_head(table, branch)
    if table is None or head is None:
        return CommitHistory(None, [])
    return commit_history(table.metadata, head.snapshot_id)


def lakehouse_commits(table: Table | None, branch: str = MAIN_BRANCH) -> list[LakehouseCommit]:
    """The lakehouse commits along the branch's ancestry after the checkpoint, oldest first."""
    return table_history(table, branch).commits


def committed_landing_files(table: Table | None, stream: str, branch: str = MAIN_BRANCH) -> set[str]:
    """The landing files the stream's commits on ``branch`` hold, from the table alone: each
    commit's ``lakehouse.landing-files`` and, for expired commits, the checkpoint's."""
    return table_history(table, branch).landing_files(stream)


def committed_state(table: Table | None, stream: str, branch: str = MAIN_BRANCH) -> CommittedState:
    """The stream's highest sequence committed to ``branch`` (0 if none), the snapshot that holds
    it and the table's newest epoch."""
    history = table_history(table, branch)
    sequence = history.sequence(stream)
    holders = [c.snapshot_id for c in history.commits if c.stream == stream and c.last_sequence == sequence]
    snapshot_id = holders[-1] if holders else (history.base.snapshot_id if sequence and history.base else None)
    return CommittedState(sequence=sequence, snapshot_id=snapshot_id, epoch=history.epoch)


def next_epoch(table: Table | None, branch: str = MAIN_BRANCH) -> int:
    """An epoch above every committer epoch in the branch's ancestry (1 for a new table)."""
    return max((commit.epoch for commit in lakehouse_commits(table, branch)), default=0) + 1
