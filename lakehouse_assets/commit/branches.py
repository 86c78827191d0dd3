"""The audit branch of a table published with ``publish: audit``, and how it relates to main.

Commits land on the table's ``audit`` branch; main, which every reader reads, only moves by a
fast-forward to a snapshot the checks passed. So main is always an ancestor of the audit branch,
except right after maintenance (which rewrites files on main while nothing waits on the audit
branch): then the audit branch is an ancestor of main and is fast-forwarded to it before the next
commit. Any other relation means someone wrote to a branch directly, and is refused loudly.
All of this is metadata: no data file is read or written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of

from lakehouse_assets.catalog.conditional_commits import set_branch_if_unchanged
from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.commit.recovery import AUDIT_BRANCH, MAIN_BRANCH, LakehouseCommit, commit_history
from lakehouse_assets.errors import BranchesDivergedError

if TYPE_CHECKING:  # the checks read branches without Spark; only the writes below need a session
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class AuditState:
    """Where main and the audit branch point, and the lakehouse commits only the audit branch has."""

    main: int | None
    audit: int | None
    unpublished: list[LakehouseCommit] = field(default_factory=list)

    @property
    def awaiting_publish(self) -> bool:
        return bool(self.unpublished)

    def unpublished_ranges(self) -> dict[str, list[int]]:
        """Per stream, the first and last batch committed to the audit branch but not published."""
        ranges: dict[str, list[int]] = {}
        for commit in self.unpublished:
            first, last = ranges.get(commit.stream, [commit.first_sequence, commit.last_sequence])
            ranges[commit.stream] = [min(first, commit.first_sequence), max(last, commit.last_sequence)]
        return ranges


def _ancestor_ids(table: Table, snapshot_id: int | None) -> list[int]:
    snapshot = table.metadata.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
    return [ancestor.snapshot_id for ancestor in ancestors_of(snapshot, table.metadata)] if snapshot else []


def _head_id(table: Table, branch: str) -> int | None:
    snapshot = table.snapshot_by_name(branch)
    return snapshot.snapshot_id if snapshot else None


def on_main(table: Table, snapshot_id: int) -> bool:
    """Whether ``snapshot_id`` is main's head or one of its ancestors."""
    return snapshot_id in _ancestor_ids(table, _head_id(table, MAIN_BRANCH))


def audit_state(table: Table | None) -> AuditState:
    """Main and the audit branch of ``table``; BranchesDivergedError when neither contains the other
    (an audit branch that is behind main, as after maintenance, reports nothing unpublished)."""
    if table is None:
        return AuditState(None, None)
    main, audit = _head_id(table, MAIN_BRANCH), _head_id(table, AUDIT_BRANCH)
    if audit is None or audit == main:
        return AuditState(main, audit)
    audit_ancestry = _ancestor_ids(table, audit)
    if main is None or main in audit_ancestry:
        commits = commit_history(table.metadata, audit).commits
        published = set(_ancestor_ids(table, main))
        return AuditState(main, audit, [commit for commit in commits if commit.snapshot_id not in published])
    if audit in _ancestor_ids(table, main):
        return AuditState(main, audit)
    raise BranchesDivergedError(
        f"main (snapshot {main}) and the audit branch (snapshot {audit}) have diverged: something wrote to "
        "one of them directly. Fast-forward, or reset the audit branch to main with `lakehouse audit discard`"
    )


def fast_forward(spark: SparkSession, identifier: str, branch: str, to: str) -> None:
    """Point ``branch`` at the head of ``to`` (Iceberg's ``fast_forward``: metadata only)."""
    spark.sql(f"CALL lake.system.fast_forward(table => '{identifier}', branch => '{branch}', to => '{to}')").collect()


def sync_audit_branch(spark: SparkSession, table: Table, identifier: str) -> bool:
    """Make the audit branch exist and contain main before a commit (lock held): create it at
    main, or fast-forward it to main after maintenance. Returns True when it moved."""
    state = audit_state(table)
    if state.audit is None:
        spark.sql(f"ALTER TABLE {qualified_name(identifier)} CREATE BRANCH IF NOT EXISTS {AUDIT_BRANCH}")
    elif state.main is not None and state.audit != state.main and not state.unpublished:
        fast_forward(spark, identifier, AUDIT_BRANCH, MAIN_BRANCH)
    else:
        return False
    spark.catalog.refreshTable(qualified_name(identifier))
    return True


def reset_audit_branch(spark: SparkSession, table: Table, identifier: str) -> bool:
    """Point the audit branch back at main, dropping its unpublished snapshots from its history
    (they stay in the table's metadata until snapshot expiry, as any replaced snapshot does), only
    on the table version ``table`` is; False, with nothing changed, when the table moved since."""
    main = _head_id(table, MAIN_BRANCH)
    if main is None:
        spark.sql(f"ALTER TABLE {qualified_name(identifier)} DROP BRANCH IF EXISTS {AUDIT_BRANCH}")
        spark.catalog.refreshTable(qualified_name(identifier))
        return True
    return set_branch_if_unchanged(spark, identifier, table.metadata_location, AUDIT_BRANCH, main)
