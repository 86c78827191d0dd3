"""OpenSearch / Elasticsearch bulk NDJSON from an Iceberg source stream's change events.

Each landing file of source events becomes ``exports/<stream>/<file>.bulk.ndjson``: per event an
action line, ``{"index": {"_id": document_id}}`` followed by the row, or ``{"delete": {"_id":
document_id}}``. The index is named by the bulk request's URL (``POST /<index>/_bulk``). Files are
written once, atomically, so an export repeated after a crash writes nothing twice; the ``_id``
makes the bulk requests themselves idempotent.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from lakehouse_assets.batches.landing import LANDING_SUFFIX, landing_dir, list_landing_files, source_snapshot_of
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.source.iceberg_source import METADATA_FIELDS

BULK_SUFFIX = ".bulk.ndjson"


@dataclass(frozen=True)
class BulkExport:
    """Bulk files written by one export, and their actions."""

    files: list[Path]
    index_actions: int
    delete_actions: int


def bulk_lines(event_line: str) -> list[str]:
    """The bulk API lines for one change event."""
    event = json.loads(event_line)
    target = {"_id": event["document_id"]} if event.get("document_id") is not None else {}
    if event["bulk_action"] == "DELETE":
        return [json.dumps({"delete": target})]
    document = {key: value for key, value in event.items() if key not in METADATA_FIELDS}
    return [json.dumps({"index": target}), json.dumps(document)]


def export_bulk_files(paths: LakehousePaths, stream: StreamSpec) -> BulkExport:
    """Write the bulk file of every source landing file that has none yet."""
    source, target = landing_dir(paths, stream), paths.exports(stream.name)
    target.mkdir(parents=True, exist_ok=True)
    written, index_actions, delete_actions = [], 0, 0
    for landed in list_landing_files(source):
        bulk = target / (landed.name.removesuffix(LANDING_SUFFIX) + BULK_SUFFIX)
        if source_snapshot_of(landed.name) is None or bulk.exists():
            continue
        lines = []
        with open(source / landed.name) as events:
            for line in events:
                if line.strip():
                    lines.extend(bulk_lines(line))
        temporary = bulk.with_name(f".{bulk.name}.tmp")
        temporary.write_text("".join(f"{line}\n" for line in lines))
        os.replace(temporary, bulk)
        written.append(bulk)
        delete_actions += sum(1 for line in lines if line.startswith('{"delete"'))
        index_actions += sum(1 for line in lines if line.startswith('{"index"'))
    return BulkExport(written, index_actions, delete_actions)
