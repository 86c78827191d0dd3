"""What is committed, derived only from the table's current snapshot ancestry.

The committer never trusts a cursor, a local file or a Dagster run for this: it walks parent
pointers from the current snapshot (not all snapshots, so a rollback re-commits what it removed)
and reads the ``lakehouse.*`` keys each commit wrote atomically with its data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from lakehouse_assets import summary_keys


@dataclass(frozen=True)
class LakehouseCommit:
    """One lakehouse commit found in the ancestry."""

    snapshot_id: int
    stream: str
    first_sequence: int
    last_sequence: int
    rows: int
    epoch: int
    run: str
    timestamp_ms: int


@dataclass(frozen=True)
class CommittedState:
    """The highest committed batch of a stream and the table's newest committer epoch."""

    sequence: int
    snapshot_id: int | None
    epoch: int


def ancestry(table: Table | None) -> Iterator[Snapshot]:
    """Snapshots from the current one back through its parents (newest first)."""
    if table is None or table.current_snapshot() is None:
        return iter(())
    return ancestors_of(table.current_snapshot(), table.metadata)


def _as_commit(snapshot: Snapshot) -> LakehouseCommit | None:
    summary = snapshot.summary.additional_properties if snapshot.summary else {}
    if summary_keys.STREAM not in summary:
        return None
    first, last = summary_keys.parse_batch_range(summary[summary_keys.BATCH_RANGE])
    return LakehouseCommit(
        snapshot_id=snapshot.snapshot_id,
        stream=summary[summary_keys.STREAM],
        first_sequence=first,
        last_sequence=last,
        rows=int(summary.get(summary_keys.ROWS, "0")),
        epoch=int(summary.get(summary_keys.COMMITTER_EPOCH, "0")),
        run=summary.get(summary_keys.COMMITTER_RUN, ""),
        timestamp_ms=snapshot.timestamp_ms,
    )


def lakehouse_commits(table: Table | None) -> list[LakehouseCommit]:
    """The lakehouse commits along the current ancestry, oldest first."""
    commits = (_as_commit(snapshot) for snapshot in ancestry(table))
    return [commit for commit in commits if commit is not None][::-1]


def committed_state(table: Table | None, stream: str) -> CommittedState:
    """The stream's highest committed sequence (0 if none) and the table's newest epoch."""
    sequence, snapshot_id, epoch = 0, None, 0
    for commit in lakehouse_commits(table):
        epoch = max(epoch, commit.epoch)
        if commit.stream == stream and commit.last_sequence >= sequence:
            sequence, snapshot_id = commit.last_sequence, commit.snapshot_id
    return CommittedState(sequence=sequence, snapshot_id=snapshot_id, epoch=epoch)
