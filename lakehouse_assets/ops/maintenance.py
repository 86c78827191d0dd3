"""Table maintenance with Iceberg's Spark procedures and APIs, holding the table's commit lock.

Compaction, snapshot expiry, orphan-file removal and manifest rewrites each commit (or delete
files) beside the committer, so they run under the same OS lock and, in Dagster, in the same
concurrency pool. Expiry first records a checkpoint of what the snapshots it removes committed
(see ``recovery``), so the committer's position survives it, and so do the names of their landing
files that are still in the landing zone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of
from pyspark.sql import SparkSession

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import landing_dir, list_landing_files
from lakehouse_assets.catalog.catalogs import S3_SCHEMES
from lakehouse_assets.catalog.conditional_commits import set_property_if_unchanged
from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.commit.branches import audit_state, sync_audit_branch
from lakehouse_assets.commit.dead_letters import dead_letter_identifier
from lakehouse_assets.commit.pass_branches import uses_pass_branches
from lakehouse_assets.commit.recovery import AUDIT_BRANCH, CHECKPOINT_PROPERTY, MAIN_BRANCH, table_history
from lakehouse_assets.commit.row_deltas import refresh_key_index
from lakehouse_assets.commit.tables import CATALOG_NAME
from lakehouse_assets.config.spec import CompactionSpec, ExpirySpec, MaintenanceSpec, StreamSpec
from lakehouse_assets.errors import TableMovedError
from lakehouse_assets.faults import crash_point
from lakehouse_assets.ingest.landing_retention import remove_committed_landing_files
from lakehouse_assets.jvm.spark_jvm import jvm as spark_jvm
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.locks import exclusive_lock, table_lock_file
from lakehouse_assets.paths import LakehousePaths

LandedCheck = Callable[[str, str], bool]
"""``landed(stream, file_name)``: whether the stream's landing file is still in the landing zone."""
# Times expiry computes its checkpoint again when the table moved under it; then it waits for the
# next maintenance.
CHECKPOINT_ATTEMPTS = 3


@dataclass(frozen=True)
class MaintenanceStep:
    """What one maintenance action did to one table."""

    table: str
    action: str
    seconds: float
    counts: dict[str, Any] = field(default_factory=dict)


def still_landed(paths: LakehousePaths, streams: list[StreamSpec]) -> LandedCheck:
    """Whether a landing file of one of ``streams`` is still landed (files of other streams count as landed)."""
    landed = {stream.name: {f.name for f in list_landing_files(landing_dir(paths, stream))} for stream in streams}
    return lambda stream, name: stream not in landed or name in landed[stream]


def _call(spark: SparkSession, procedure: str, arguments: str) -> dict[str, Any]:
    rows = spark.sql(f"CALL {CATALOG_NAME}.system.{procedure}({arguments})").collect()
    return rows[0].asDict() if rows else {}


def _has_delete_files(table: Table) -> bool:
    snapshot = table.current_snapshot()
    summary = snapshot.summary.additional_properties if snapshot and snapshot.summary else {}
    return int(summary.get("total-delete-files", "0")) > 0


def compact(spark: SparkSession, table: Table, identifier: str, spec: CompactionSpec) -> dict[str, Any]:
    """Bin-pack small data files (and those with many deletes), then compact position deletes."""
    options = {
        "min-input-files": spec.min_input_files,
        "delete-file-threshold": spec.delete_file_threshold,
        "target-file-size-bytes": spec.target_file_size_bytes,
        # Delete files whose data files were all rewritten would stay referenced without this.
        "remove-dangling-deletes": "true",
    }
    option_map = ", ".join(f"'{key}', '{value}'" for key, value in options.items())
    counts = _call(spark, "rewrite_data_files", f"table => '{identifier}', options => map({option_map})")
    # Position-delete files exist only in format v2; v3 deletion vectors are rewritten with the data.
    if table.metadata.format_version == 2 and _has_delete_files(table):
        # Rewriting position deletes also drops those whose data files compaction just replaced.
        arguments = f"table => '{identifier}', options => map('min-input-files', '{spec.min_input_files}')"
        deletes = _call(spark, "rewrite_position_delete_files", arguments)
        counts.update({f"position_deletes_{key}": value for key, value in deletes.items()})
    return counts


def retained_ancestors(table: Table, older_than_ms: int, retain_last: int) -> list[Snapshot]:
    """The current ancestors ``expire_snapshots`` keeps, newest first.

    Mirrors Iceberg's rule (``RemoveSnapshots.computeBranchSnapshotsToRetain``): walk back from the
    current snapshot keeping ancestors while fewer than ``retain_last`` are kept or the ancestor is
    not older than ``older_than_ms``; the first ancestor that fails both ends the walk.
    """
    kept: list[Snapshot] = []
    for ancestor in ancestors_of(table.current_snapshot(), table.metadata):
        if len(kept) < retain_last or ancestor.timestamp_ms >= older_than_ms:
            kept.append(ancestor)
        else:
            break
    return kept


def record_checkpoint(
    spark: SparkSession,
    table: Table,
    identifier: str,
    oldest_kept: Snapshot,
    landed: LandedCheck,
) -> bool:
    """Record what the commits up to ``oldest_kept`` added, unless the recorded checkpoint is at or after it.

    Of their landing files only those still ``landed`` are carried: landing retention removes a
    file only once a checkpoint covers its batch, and a removed file cannot be batched again.
    The checkpoint is written only onto the metadata ``table`` was read from: another host may
    have recorded a newer one since (then this raises TableMovedError and records nothing).
    """
    history = table_history(table)
    if oldest_kept.snapshot_id not in {snapshot.snapshot_id for snapshot in history.snapshots}:
        return False
    checkpoint = history.checkpoint_at(oldest_kept.snapshot_id)
    carried = {
        stream: sorted({name for name in files if landed(stream, name)})
        for stream, files in checkpoint.landing_files.items()
    }
    checkpoint = replace(checkpoint, landing_files={stream: files for stream, files in carried.items() if files})
    if not set_property_if_unchanged(
        spark, identifier, table.metadata_location, CHECKPOINT_PROPERTY, checkpoint.to_json()
    ):
        raise TableMovedError(f"table {identifier} changed while its checkpoint was computed")
    return True


def expire_snapshots(
    spark: SparkSession,
    lake: Lakehouse,
    identifier: str,
    spec: ExpirySpec,
    now_ms: int,
    landed_now: Callable[[], LandedCheck],
) -> dict[str, Any]:
    """Expire old snapshots after recording the checkpoint that keeps recovery working.

    Another host may commit to or maintain the same table meanwhile: a checkpoint computed from a
    version that is no longer current is computed again (``landed_now()`` lists the landing zone
    after each read of the table), and on a catalog shared across hosts the expiry keeps every
    snapshot from the checkpoint's on, however many commits arrive before it counts ``retain_last``
    from the head it finds.
    """
    older_than_ms = now_ms - int(spec.older_than * 1000)
    for attempt in range(1, CHECKPOINT_ATTEMPTS + 1):
        table = lake.require_table(identifier)
        kept = retained_ancestors(table, older_than_ms, spec.retain_last)
        tried = {"checkpoint_attempts": attempt, "snapshots_kept_in_ancestry": len(kept)}
        if len(kept) == len(table.metadata.snapshots):
            # Every snapshot is a retained ancestor: the expiry would remove nothing (a routed
            # database has hundreds of such small tables; each would commit for nothing).
            return {"checkpoint_recorded": False, **tried, "skipped": "nothing expires"}
        crash_point(faults.MAINTENANCE_BEFORE_CHECKPOINT)
        try:
            recorded = kept[-1].parent_snapshot_id is not None and record_checkpoint(
                spark, table, identifier, kept[-1], landed_now()
            )
            break
        except TableMovedError:
            continue
    else:
        return {"checkpoint_recorded": False, **tried, "skipped": "the table changed under every checkpoint"}
    crash_point(faults.MAINTENANCE_AFTER_CHECKPOINT)
    if uses_pass_branches(lake.config):
        older_than_ms = min(older_than_ms, kept[-1].timestamp_ms)
    expired = _expire(spark, identifier, older_than_ms, spec.retain_last)
    return {"checkpoint_recorded": recorded, **tried, "snapshots_expired": expired}


def _expire(spark: SparkSession, identifier: str, older_than_ms: int, retain_last: int) -> int:
    """Expire with Iceberg's ``ExpireSnapshots`` API; returns how many snapshots went.

    The ``expire_snapshots`` procedure expires the same snapshots (through this API), then finds
    the files only they referenced with Spark jobs over the manifests. The API finds and deletes
    them on the driver (Iceberg's local file cleanup): about 0.1 s per table of a pipeline round
    here, against 1.3 s for the procedure (``docs/benchmarks.md``).
    """
    jvm, session = spark_jvm(spark), spark._jsparkSession
    java_table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(session, qualified_name(identifier))
    before = {snapshot.snapshotId() for snapshot in java_table.snapshots()}
    java_table.expireSnapshots().expireOlderThan(older_than_ms).retainLast(retain_last).commit()
    return len(before - {snapshot.snapshotId() for snapshot in java_table.snapshots()})


def remove_orphan_files(spark: SparkSession, identifier: str, older_than_seconds: float, now_ms: int) -> dict[str, Any]:
    """Delete files under the table's location that no metadata references and that are older than the grace.

    Goes around the ``remove_orphan_files`` procedure, which refuses a grace under 24 hours, to the
    same Spark action it calls: the grace is the user's setting (tests use seconds).
    """
    jvm, session = spark_jvm(spark), spark._jsparkSession
    java_table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(session, qualified_name(identifier))
    action = (
        jvm.org.apache.iceberg.spark.actions.SparkActions.get(session)
        .deleteOrphanFiles(java_table)
        .olderThan(now_ms - int(older_than_seconds * 1000))
    )
    if str(java_table.location()).startswith(S3_SCHEMES):
        # The action lists through Hadoop's file systems unless told to list through the table's
        # FileIO, and Spark has no Hadoop file system for s3:// (S3FileIO is the table's).
        action = action.usePrefixListing(True)
    result = action.execute()
    # A store that keeps objects in a file system (S3Proxy's) lists its directories too, as
    # names ending in "/": they are no files of the table.
    orphans = [str(location) for location in result.orphanFileLocations() if not str(location).endswith("/")]
    # The action deletes in bulk where the FileIO can (S3's DeleteObjects) and only logs a bulk
    # delete the store refused, yet still reports the files: S3Proxy answers DeleteObjects from
    # the AWS SDK with 501 Not Implemented. What is still there is deleted one file at a time, and
    # what even that leaves is reported, never counted as removed.
    io = java_table.io()
    for location in [location for location in orphans if io.newInputFile(location).exists()]:
        io.deleteFile(location)
    left = [location for location in orphans if io.newInputFile(location).exists()]
    examples = (left or orphans)[:5]
    return {"orphan_files_removed": len(orphans) - len(left), "orphan_files_left": len(left), "examples": examples}


def rewrite_manifests(spark: SparkSession, identifier: str) -> dict[str, Any]:
    """Cluster manifests so scans plan from few, well-sorted manifests."""
    return _call(spark, "rewrite_manifests", f"table => '{identifier}'")


# Actions that commit to main; they wait while an audit branch holds unpublished commits, which
# must stay fast-forwardable onto main.
REWRITES = ("compaction", "rewrite_manifests", "expire_snapshots")


def _maintain_one(
    spark: SparkSession,
    lake: Lakehouse,
    identifier: str,
    spec: MaintenanceSpec,
    landed_now: Callable[[], LandedCheck],
    awaiting_publish: bool = False,
) -> list[MaintenanceStep]:
    steps: list[MaintenanceStep] = []

    def now_ms() -> int:
        return int(time.time() * 1000)

    actions = [
        ("compaction", spec.compaction.enabled, lambda table: compact(spark, table, identifier, spec.compaction)),
        ("rewrite_manifests", spec.rewrite_manifests, lambda table: rewrite_manifests(spark, identifier)),
        (
            "expire_snapshots",
            spec.expire_snapshots.enabled,
            lambda table: expire_snapshots(spark, lake, identifier, spec.expire_snapshots, now_ms(), landed_now),
        ),
        (
            "remove_orphan_files",
            spec.remove_orphan_files.enabled,
            lambda table: remove_orphan_files(spark, identifier, spec.remove_orphan_files.older_than, now_ms()),
        ),
    ]
    for action, enabled, run in actions:
        table = lake.table(identifier)
        if not enabled or table is None or table.current_snapshot() is None:
            continue
        if awaiting_publish and action in REWRITES:
            steps.append(MaintenanceStep(identifier, action, 0.0, {"skipped": "the audit branch awaits publishing"}))
            continue
        started = time.monotonic()
        counts = run(table)
        steps.append(MaintenanceStep(identifier, action, time.monotonic() - started, counts))
    return steps


def maintain_table(spark: SparkSession, lake: Lakehouse, table_identifier: str) -> list[MaintenanceStep]:
    """Run every enabled maintenance action on the table and its dead-letter table, then remove
    landing files that are committed beyond any rollback and older than the retention. Under
    ``publish: audit`` the rewrites wait while commits await publishing, and the audit branch
    is brought up to main after them."""
    spec = lake.config.maintenance(table_identifier)
    steps: list[MaintenanceStep] = []
    audited = lake.config.audits(table_identifier)
    with exclusive_lock(table_lock_file(lake.paths.locks, table_identifier)):
        table = lake.table(table_identifier)
        awaiting = audited and audit_state(table).awaiting_publish
        landed_now = partial(still_landed, lake.paths, lake.config.tables[table_identifier])
        steps.extend(_maintain_one(spark, lake, table_identifier, spec, landed_now, awaiting))
        steps.extend(_maintain_one(spark, lake, dead_letter_identifier(table_identifier), spec, landed_now))
        table = lake.table(table_identifier)
        if audited and table is not None:
            sync_audit_branch(spark, table, table_identifier)
        branch = AUDIT_BRANCH if audited else MAIN_BRANCH
        for stream in lake.config.tables[table_identifier]:
            started = time.monotonic()
            if refresh_key_index(spark, lake, stream, branch):
                action = f"key_index_rebuilt:{stream.name}"
                steps.append(MaintenanceStep(table_identifier, action, time.monotonic() - started))
        for stream in lake.config.tables[table_identifier]:
            started = time.monotonic()
            removed = remove_committed_landing_files(lake.paths, stream, table, time.time())
            steps.append(
                MaintenanceStep(
                    table_identifier, f"landing_retention:{stream.name}", time.monotonic() - started, removed
                )
            )
    return steps
