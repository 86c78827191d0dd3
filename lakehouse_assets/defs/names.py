"""Names of the Dagster objects built per stream and per table (asset keys mirror identifiers)."""

from __future__ import annotations

import dagster as dg

GROUP_NAME = "lakehouse"
STAGING_PREFIX = "staging"
STREAM_TAG = "lakehouse/stream"
SEQUENCE_TAG = "lakehouse/sequence"
TABLE_TAG = "lakehouse/table"
PRIORITY_TAG = "dagster/priority"
"""Dagster's run-queue priority: higher is dequeued first."""
COMMITTER_PRIORITY = 10
"""A committer run jumps the queue: it publishes what writer runs already staged."""
BACKGROUND_PRIORITY = -10
"""Maintenance and freshness runs wait behind every writer and committer run."""
WRITER_RETRY_TAG = "lakehouse/writer-retry"
"""How many times the landing sensor requested a batch again after its writer run failed and Dagster
retried it no more (absent on the first request); Dagster's own retries of a run copy it."""
WRITER_RETRY_REASON_TAG = "lakehouse/writer-retry-reason"
"""Why the landing sensor requested a batch again: the failed run and the backoff waited."""
# Dagster's own run tags (``dagster._core.storage.tags``; a test pins them).
WILL_RETRY_TAG = "dagster/will_retry"
"""Set by Dagster on a failed run when run retries are enabled: whether it will launch a retry."""
RETRY_NUMBER_TAG = "dagster/retry_number"
MAX_RETRIES_TAG = "dagster/max_retries"

# Dagster's standard metadata keys: the asset catalog, search and column lineage read them. As
# strings: Dagster 1.13 does not export ``TableMetadataSet`` and ``UriMetadataSet``, which write
# these keys, from its public API (only from ``dagster._core``); ``TableSchema`` and ``TableColumn``
# for the column schema are public and used.
ROW_COUNT_METADATA = "dagster/row_count"
COLUMN_SCHEMA_METADATA = "dagster/column_schema"
TABLE_NAME_METADATA = "dagster/table_name"
URI_METADATA = "dagster/uri"

SCHEMA_CHECK = "schema_matches_declared"
ROW_COUNT_CHECK = "rows_reconcile_with_batches"
SEQUENCE_CHECK = "batch_ranges_contiguous"
DATA_FILES_CHECK = "data_files_unique"
KEYS_UNIQUE_CHECK = "identifier_keys_unique"
CHANGES_APPLIED_CHECK = "changes_applied"
FRESHNESS_CHECK = "lag_within_bound"
DEAD_LETTERS_CHECK = "no_new_dead_letters"
EXPECTATIONS_CHECK = "expectations_met"
RUN_RANGES_METADATA = "batch_ranges_this_run"
CHECK_NAMES = (SCHEMA_CHECK, ROW_COUNT_CHECK, SEQUENCE_CHECK, DATA_FILES_CHECK)
CHANGE_CHECK_NAMES = (KEYS_UNIQUE_CHECK, CHANGES_APPLIED_CHECK)


def table_key(table_identifier: str) -> dg.AssetKey:
    return dg.AssetKey(table_identifier.split("."))


def published_key(table_identifier: str) -> dg.AssetKey:
    """Main of a ``publish: audit`` table: what its readers see."""
    return dg.AssetKey([*table_identifier.split("."), "published"])


def publish_job_name(table_identifier: str) -> str:
    return f"{table_identifier.replace('.', '_')}_publish_job"


def discard_job_name(table_identifier: str) -> str:
    return f"{table_identifier.replace('.', '_')}_discard_audit_job"


def discard_op_name(table_identifier: str) -> str:
    return f"discard_audit_{table_identifier.replace('.', '_')}"


def complete_days_key(table_identifier: str) -> dg.AssetKey:
    return dg.AssetKey([*table_identifier.split("."), "complete_days"])


def staged_batches_key(stream: str) -> dg.AssetKey:
    """``staging/<stream>_batches``: its own label in the lineage graph, which shows a key's last
    part only (``staging/orders`` showed as ``orders``, like the table ``sales/orders``)."""
    return dg.AssetKey([STAGING_PREFIX, f"{stream}_batches"])


def source_key(stream: str) -> dg.AssetKey:
    return dg.AssetKey(["source", stream])


def search_export_key(stream: str) -> dg.AssetKey:
    return dg.AssetKey(["search_export", stream])


def source_job_name(stream: str) -> str:
    return f"{stream}_source_job"


def source_sensor_name(stream: str) -> str:
    return f"{stream}_source_sensor"


def staged_batches_op(stream: str) -> str:
    return staged_batches_key(stream).to_python_identifier()


def stage_job_name(stream: str) -> str:
    return f"{stream}_stage_job"


def commit_job_name(table_identifier: str) -> str:
    return f"{table_identifier.replace('.', '_')}_commit_job"


def landing_sensor_name(stream: str) -> str:
    return f"{stream}_landing_sensor"


def staged_sensor_name(table_identifier: str) -> str:
    return f"{table_identifier.replace('.', '_')}_staged_batches_sensor"


def commit_pool(table_identifier: str) -> str:
    return f"iceberg_commit/{table_identifier}"


def maintenance_job_name(table_identifier: str) -> str:
    return f"{table_identifier.replace('.', '_')}_maintenance_job"


def maintenance_op_name(table_identifier: str) -> str:
    return f"maintain_{table_identifier.replace('.', '_')}"


def maintenance_schedule_name(table_identifier: str) -> str:
    return f"{table_identifier.replace('.', '_')}_maintenance_schedule"


def freshness_job_name(table_identifier: str) -> str:
    return f"{table_identifier.replace('.', '_')}_freshness_job"


def check_job_name(table_identifier: str) -> str:
    return f"{table_identifier.replace('.', '_')}_check_job"


def freshness_schedule_name(table_identifier: str) -> str:
    return f"{table_identifier.replace('.', '_')}_freshness_schedule"
