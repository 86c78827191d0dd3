"""A fenced committer pass over one table, and the one way it writes: until the ancestry shows it.

Every commit of the project goes through a :class:`CommitterPass`: a table's batches
(``commit.committer``) and their rejected events in the table's dead-letter table
(``commit.dead_letters``), whichever run commits them (a committer, the router, an audited
publish). A pass plans from the head it read, is fenced when that head moved or a newer
committer wrote, and decides whether its commit landed only from the table's ancestry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pyiceberg.table import Table
from pyspark.sql import SparkSession

from lakehouse_assets import faults
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.commit.recovery import (
    AUDIT_BRANCH,
    MAIN_BRANCH,
    branch_head,
    branch_head_id,
    committed_state,
    lakehouse_commits,
    next_epoch,
)
from lakehouse_assets.errors import CommitOutcomeUnknownError, FencedError
from lakehouse_assets.faults import crash_point
from lakehouse_assets.jvm.spark_jvm import is_commit_conflict
from lakehouse_assets.lakehouse import Lakehouse

COMMIT_ATTEMPTS = 3


@dataclass(frozen=True)
class CommitTarget:
    """Where one committer pass writes, decided once before it writes and never changed: ``branch``
    receives its commits; ``publishes_to`` is the branch readers see. The three targets: main
    directly (``direct``), the audit branch of a table published with ``publish: audit``
    (``audited``), and, on a catalog that fences across hosts, the pass's own branch
    (``pass_branches``), fast-forwarded onto the other target when the pass succeeds."""

    branch: str
    publishes_to: str

    @classmethod
    def direct(cls) -> CommitTarget:
        return cls(MAIN_BRANCH, MAIN_BRANCH)

    @classmethod
    def audited(cls) -> CommitTarget:
        return cls(AUDIT_BRANCH, AUDIT_BRANCH)

    def on_pass_branch(self, name: str) -> CommitTarget:
        """This target's commits written on pass branch ``name`` first."""
        return CommitTarget(name, self.publishes_to)

    @property
    def is_pass_branch(self) -> bool:
        return self.branch != self.publishes_to


@dataclass
class CommitterPass:
    """One committer pass over one table: its engine, epoch, target, and the head of the target's
    branch it expects (its fence), which only its own commits move.

    It reads the table once and again only where it must: after it wrote to the table itself
    (``reread``) and at the fence, which must see what others committed. On a REST catalog or an
    object store every read is a round trip and a metadata file."""

    spark: SparkSession
    lake: Lakehouse
    table_identifier: str
    run_id: str
    epoch: int
    target: CommitTarget
    expected_snapshot_id: int | None
    read: Table | None = field(default=None, repr=False)
    """The table as this pass last read it."""

    @classmethod
    def begin(
        cls,
        spark: SparkSession,
        lake: Lakehouse,
        table_identifier: str,
        run_id: str,
        target: CommitTarget,
    ) -> CommitterPass:
        """A pass over the table as it is now: an epoch above every epoch in its branch's ancestry,
        and the branch's head as the base it expects."""
        table = lake.table(table_identifier)
        return cls(
            spark=spark,
            lake=lake,
            table_identifier=table_identifier,
            run_id=run_id,
            epoch=next_epoch(table, target.branch),
            target=target,
            expected_snapshot_id=branch_head_id(table, target.branch),
            read=table,
        )

    def on_pass_branch(self, name: str) -> CommitterPass:
        """The same pass writing on its pass branch ``name`` (just opened at the expected head; on
        a table with no snapshot yet, at a new empty one)."""
        return replace(
            self,
            target=self.target.on_pass_branch(name),
            expected_snapshot_id=branch_head_id(self.reread(), name),
        )

    @property
    def branch(self) -> str:
        """The branch this pass's commits go to."""
        return self.target.branch

    def expect(self, snapshot_id: int | None) -> None:
        """Move the fence to ``snapshot_id``: the branch's head after this pass's own commit, or
        after a conflict the head it read again."""
        self.expected_snapshot_id = snapshot_id

    @property
    def stamp(self) -> summary_keys.CommitStamp:
        return summary_keys.CommitStamp(self.epoch, self.run_id)

    def table(self) -> Table | None:
        """The table as this pass last read it (None: it does not exist)."""
        return self.read

    def reread(self) -> Table | None:
        """The table as committed now: after this pass wrote to it, or to see others' commits."""
        self.read = self.lake.table(self.table_identifier)
        return self.read

    def check_fence(self) -> None:
        """Raise FencedError when the branch moved from the expected base or a newer committer wrote."""
        table = self.reread()
        head = branch_head(table, self.branch)
        current = head.snapshot_id if head else None
        if current != self.expected_snapshot_id:
            raise FencedError(
                f"table {self.table_identifier} ({self.branch}) moved from snapshot {self.expected_snapshot_id} to "
                f"{current} since this committer planned; stopping without committing"
            )
        for commit in lakehouse_commits(table, self.branch):
            if commit.epoch > self.epoch or (commit.epoch == self.epoch and commit.run != self.run_id):
                raise FencedError(
                    f"table {self.table_identifier}: committer run {commit.run} with epoch {commit.epoch} "
                    f"committed after this one (epoch {self.epoch}) started; stopping without committing"
                )


@dataclass(frozen=True)
class WritePoints:
    """The named fault points around one kind of write: before it, and after it returned."""

    before_commit: str
    after_write: str


TABLE_WRITE = WritePoints(faults.COMMITTER_BEFORE_COMMIT, faults.COMMITTER_AFTER_WRITE)
DEAD_LETTER_WRITE = WritePoints(faults.DEAD_LETTERS_BEFORE_COMMIT, faults.DEAD_LETTERS_AFTER_WRITE)


def write_until_landed(
    committer: CommitterPass,
    stream_name: str,
    last_sequence: int,
    write: Callable[[], None],
    points: WritePoints = TABLE_WRITE,
) -> Table:
    """Run ``write`` until the ancestry shows ``last_sequence`` of ``stream_name``; returns the
    table as committed.

    Only the ancestry decides: a write that raised may have landed (the catalog failed after the
    commit), and one that returned is confirmed. A commit conflict is retried after re-reading;
    when the conflicting commit was another committer's of the same batches, nothing is written.
    """
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        committer.check_fence()
        crash_point(points.before_commit)
        try:
            write()
            crash_point(points.after_write)
            error = None
        except Exception as raised:  # noqa: BLE001 - py4j errors of any kind; the ancestry decides below
            error = raised
        confirmed = committer.reread()
        if (
            confirmed is not None
            and committed_state(confirmed, stream_name, committer.branch).sequence >= last_sequence
        ):
            return confirmed
        if error is None:
            raise CommitOutcomeUnknownError(
                f"table {committer.table_identifier}: the commit of batch {last_sequence} returned but the ancestry "
                "does not show it; staged data is kept for the next run"
            )
        if not is_commit_conflict(error) or attempt == COMMIT_ATTEMPTS:
            raise error
        committer.expect(branch_head_id(confirmed, committer.branch))
    raise AssertionError("unreachable")
