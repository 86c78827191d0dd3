"""Per-table figures for ``lakehouse status``: the table's files and snapshots, each stream's
committed sequence, backlog and lag, and the last check results."""

from __future__ import annotations

from typing import Any

import dagster as dg
from pyiceberg.table import Table

from lakehouse_assets.commit.branches import audit_state
from lakehouse_assets.commit.recovery import committed_state
from lakehouse_assets.config.spec import LakehouseConfig, StreamSpec
from lakehouse_assets.defs import names
from lakehouse_assets.defs.check_status import blocking_check_names
from lakehouse_assets.ingest.kafka_batching import kafka_progress
from lakehouse_assets.ingest.micro_batching import backpressure
from lakehouse_assets.ingest.pending_landing import pending_files
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.quality.lag import stream_lag_seconds
from lakehouse_assets.quality.table_stats import table_stats
from lakehouse_assets.source.iceberg_source import load_source_table, read_cursor


def _check_status(record: Any) -> str:
    """SUCCEEDED, FAILED, or WARNED for a failed check of severity WARN (for example new dead letters)."""
    evaluation = record.evaluation
    # A check planned by a run that died before it ran has no evaluation (no verdict) yet.
    if not isinstance(evaluation, dg.AssetCheckEvaluation):
        return record.status.value
    if not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN:
        return "WARNED"
    return record.status.value


def _last_checks(
    instance: dg.DagsterInstance | None, table_identifier: str, streams: list[StreamSpec]
) -> dict[str, str]:
    if instance is None:
        return {}
    results = {}
    for check_name in (*blocking_check_names(streams), names.FRESHNESS_CHECK, names.DEAD_LETTERS_CHECK):
        key = dg.AssetCheckKey(names.table_key(table_identifier), check_name)
        record = instance.get_latest_asset_check_evaluation_record(key)
        results[check_name] = _check_status(record) if record else "never run"
    return results


def _source_progress(lake: Lakehouse, stream: StreamSpec) -> dict[str, Any]:
    """For an Iceberg source stream: the source snapshot reached and the source's current one."""
    if not stream.iceberg_source:
        return {}
    cursor = read_cursor(lake.paths, stream)
    source = load_source_table(lake, stream)
    current = source.current_snapshot() if source else None
    return {
        "source_table": stream.source_table.table,
        "source_snapshot_synced": cursor.snapshot_id if cursor else None,
        "source_snapshot_current": current.snapshot_id if current else None,
    }


def _audit_progress(config: LakehouseConfig, table_identifier: str, table: Table | None) -> dict[str, Any]:
    """Under ``publish: audit``: the audit branch's head and the batches it holds that main does not."""
    if not config.audits(table_identifier):
        return {"publish": "direct"}
    state = audit_state(table)
    return {"publish": "audit", "audit_snapshot_id": state.audit, "unpublished_batches": state.unpublished_ranges()}


def lakehouse_status(lake: Lakehouse, instance: dg.DagsterInstance | None) -> list[dict[str, Any]]:
    """One entry per table with its streams' progress, the last check results and the storage
    root's room (``batches.headroom``: the same for every table)."""
    storage = lake.storage_room().as_status()
    report = []
    for table_identifier, streams in lake.config.tables.items():
        table = lake.table(table_identifier)
        snapshot = table.current_snapshot() if table else None
        stream_entries = []
        for stream in streams:
            ledger = lake.ledger(stream.name)
            state = committed_state(table, stream.name)
            open_batches = ledger.batches(after=state.sequence)
            waiting = pending_files(lake.paths, stream, ledger, table)
            stream_entries.append(
                {
                    "stream": stream.name,
                    "committed_sequence": state.sequence,
                    "batches_minted": sum(1 for r in open_batches if r.status == "minted"),
                    "batches_staged": sum(1 for r in open_batches if r.status == "staged"),
                    "landing_files_pending": len(waiting),
                    "landing_bytes_pending": sum(f.size for f in waiting),
                    "lag_seconds": round(stream_lag_seconds(lake.paths, stream, table), 3),
                    "max_lag_seconds": stream.max_lag,
                    "held_back": backpressure(ledger, stream, state.sequence),
                }
                | _source_progress(lake, stream)
                | (kafka_progress(lake, stream).as_status() if stream.kafka_source else {})
            )
        report.append(
            {
                "table": table_identifier,
                "exists": table is not None,
                "snapshot_id": snapshot.snapshot_id if snapshot else None,
                **table_stats(table),
                "streams": stream_entries,
                "last_checks": _last_checks(instance, table_identifier, streams),
                "storage": storage,
            }
            | _audit_progress(lake.config, table_identifier, table)
        )
    return report
