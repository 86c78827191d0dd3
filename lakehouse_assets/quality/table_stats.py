"""Figures that say whether a table stays healthy under streaming writes, read from its metadata."""

from __future__ import annotations

from pyiceberg.table import Table


def table_stats(table: Table | None) -> dict[str, int | float]:
    """Data and delete files, rows, average data-file size, snapshot count and metadata-file size."""
    if table is None:
        return {}
    snapshot = table.current_snapshot()
    summary = snapshot.summary.additional_properties if snapshot and snapshot.summary else {}
    data_files = int(summary.get("total-data-files", "0"))
    files_bytes = int(summary.get("total-files-size", "0"))
    return {
        "table_rows": int(summary.get("total-records", "0")),
        "table_data_files": data_files,
        "table_delete_files": int(summary.get("total-delete-files", "0")),
        "table_avg_file_bytes": round(files_bytes / data_files) if data_files else 0,
        "table_snapshots": len(table.metadata.snapshots),
        "table_metadata_bytes": len(table.io.new_input(table.metadata_location)),
    }
