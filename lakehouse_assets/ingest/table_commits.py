"""A table's committer pass as the runtime runs it: ``commit.committer.commit_pass`` with ingest's
staging, so a ready batch whose staged data is gone (expired with its staged snapshot, or
discarded from the audit branch) is staged again from its landing files under the pass's lock.
``commit`` imports nothing from ``ingest``; this is where the two meet."""

from pyspark.sql import SparkSession

from lakehouse_assets.commit.committer import CommitOutcome, commit_pass
from lakehouse_assets.ingest.staging import stage_again
from lakehouse_assets.lakehouse import Lakehouse


def commit_table(spark: SparkSession, lake: Lakehouse, table_identifier: str, run_id: str) -> CommitOutcome:
    """Commit every stream's ready batches to one table (``commit.committer.commit_pass``)."""
    return commit_pass(spark, lake, table_identifier, run_id, stage_again)
