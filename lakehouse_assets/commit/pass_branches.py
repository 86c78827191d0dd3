"""Commits fenced by the catalog across hosts: write on a branch of one's own, publish by fast-forward.

An Iceberg append re-reads the table right before it commits and adds its files to whatever it
finds, so a committer that planned from snapshot P would append a batch that another host committed
after P. On one host the table's OS lock rules that out; across hosts only the catalog's
compare-and-swap is shared. So on a catalog other than ``hadoop`` (JDBC, REST, Hive, Glue: each
swaps the metadata pointer atomically) a committer pass writes to a *pass branch* created at the
head it planned from, and publishes it with Iceberg's fast-forward (removing the pass branch in the
same commit), which validates that the target's head is still an ancestor of the pass branch and
swaps against the metadata it validated (Iceberg's own retry is off on managed tables). Of two
hosts that committed the same batch, the first to publish wins; the other publishes nothing, and
its batches stay staged for its next pass, which finds them committed. All of this is metadata:
no data file is rewritten.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pyiceberg.table import Table
from pyspark.sql import SparkSession

from lakehouse_assets import faults
from lakehouse_assets.catalog.table_metadata import is_hadoop_catalog, qualified_name
from lakehouse_assets.commit.summary_keys import CommitStamp
from lakehouse_assets.config.spec import LakehouseConfig
from lakehouse_assets.errors import FencedError
from lakehouse_assets.faults import crash_point
from lakehouse_assets.jvm.spark_jvm import is_commit_conflict
from lakehouse_assets.jvm.spark_jvm import jvm as spark_jvm

PASS_BRANCH_PREFIX = "lakehouse_pass_"
SWAP_ATTEMPTS = 5
# A pass branch older than this belongs to a pass that died; it only holds snapshots back from expiry.
ABANDONED_AFTER_SECONDS = 24 * 3600


def uses_pass_branches(config: LakehouseConfig) -> bool:
    """Whether commits go through pass branches: on every catalog with a compare-and-swap."""
    return not is_hadoop_catalog(config.catalog)


def pass_branch_name(epoch: int, run_id: str) -> str:
    """The pass branch of one committer pass (letters, digits and underscores only)."""
    return f"{PASS_BRANCH_PREFIX}{epoch}_{re.sub(r'[^0-9A-Za-z]', '', run_id)[:12]}"


def _swapped(change: Callable[[], object]) -> None:
    """Run a metadata change, again while the catalog's swap fails because another committer
    changed the table's metadata meanwhile (each attempt validates against what it reads)."""
    for attempt in range(1, SWAP_ATTEMPTS + 1):
        try:
            change()
            return
        except Exception as error:  # noqa: BLE001 - py4j wraps Iceberg's CommitFailedException
            if not is_commit_conflict(error) or attempt == SWAP_ATTEMPTS:
                raise
            time.sleep(0.1 * attempt)


def open_pass_branch(spark: SparkSession, identifier: str, name: str, head: int | None) -> None:
    """Create the pass branch at ``head`` (on a table with no snapshot yet: at a new empty one)."""
    version = f" AS OF VERSION {head}" if head is not None else ""
    _swapped(lambda: spark.sql(f"ALTER TABLE {qualified_name(identifier)} CREATE BRANCH {name}{version}"))
    spark.catalog.refreshTable(qualified_name(identifier))


def publish_pass_branch(spark: SparkSession, identifier: str, name: str, target: str) -> None:
    """Fast-forward ``target`` to the pass branch and remove the pass branch, in one catalog commit
    (Iceberg's ``ManageSnapshots``, which the ``fast_forward`` procedure calls for the first half:
    one change instead of two, each a round trip and a metadata file on a REST catalog and an object
    store). FencedError when another committer published to ``target`` since the pass branch was
    created; then nothing of this pass is published and the pass branch stays for the caller to drop."""

    def publish() -> None:
        table = spark_jvm(spark).org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            spark._jsparkSession, qualified_name(identifier)
        )
        table.manageSnapshots().fastForwardBranch(target, name).removeBranch(name).commit()

    try:
        _swapped(publish)
    except Exception as error:  # noqa: BLE001 - py4j wraps Iceberg's validation error
        if "not an ancestor" in str(error):
            raise FencedError(
                f"table {identifier}: another committer published to {target} while this pass wrote its "
                "batches on its own branch; nothing of this pass was published"
            ) from error
        raise
    spark.catalog.refreshTable(qualified_name(identifier))


def drop_pass_branch(spark: SparkSession, identifier: str, name: str) -> None:
    """Remove the pass branch (its published snapshots stay in the target's history)."""
    _swapped(lambda: spark.sql(f"ALTER TABLE {qualified_name(identifier)} DROP BRANCH IF EXISTS {name}"))


@contextmanager
def written_on_pass_branch(
    spark: SparkSession, config: LakehouseConfig, identifier: str, head: int | None, target: str, stamp: CommitStamp
) -> Iterator[str]:
    """The branch to write the block's commits to: ``target`` itself, or, on a catalog that fences
    across hosts, a pass branch created at ``head``, published to ``target`` and removed in one
    commit when the block succeeds (FencedError when another committer published first), dropped
    otherwise."""
    if not uses_pass_branches(config):
        yield target
        return
    name = pass_branch_name(stamp.epoch, stamp.run_id)
    open_pass_branch(spark, identifier, name, head)
    published = False
    try:
        yield name
        crash_point(faults.COMMITTER_BEFORE_PUBLISH, identifier)
        publish_pass_branch(spark, identifier, name, target)
        published = True
    finally:
        if not published:
            drop_pass_branch(spark, identifier, name)


def abandoned_pass_branches(table: Table | None, now: float | None = None) -> list[str]:
    """Pass branches whose head is older than a day: left by passes that died before dropping them."""
    if table is None:
        return []
    cutoff = ((time.time() if now is None else now) - ABANDONED_AFTER_SECONDS) * 1000
    heads = {name: table.metadata.snapshot_by_id(ref.snapshot_id) for name, ref in table.metadata.refs.items()}
    return [
        name
        for name, head in heads.items()
        if name.startswith(PASS_BRANCH_PREFIX) and head is not None and head.timestamp_ms < cutoff
    ]
