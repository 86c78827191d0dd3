"""How far a stream is behind: the age of its oldest event not yet committed."""

from __future__ import annotations

import time

from pyiceberg.table import Table

from lakehouse_assets.batches.ledger import StreamLedger
from lakehouse_assets.commit.recovery import committed_state
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.ingest.pending_landing import pending_files
from lakehouse_assets.paths import LakehousePaths


def oldest_pending_landed_at(paths: LakehousePaths, stream: StreamSpec, table: Table | None) -> float | None:
    """When the oldest event not yet committed landed: in an uncommitted batch or not batched yet."""
    ledger = StreamLedger(paths.staging(stream.name))
    committed = committed_state(table, stream.name).sequence
    landed = [record.minted.oldest_landed_at for record in ledger.batches(after=committed)]
    landed += [file.landed_at for file in pending_files(paths, stream, ledger, table)]
    return min(landed, default=None)


def stream_lag_seconds(
    paths: LakehousePaths, stream: StreamSpec, table: Table | None, now: float | None = None
) -> float:
    """Seconds the oldest uncommitted event of ``stream`` has waited; 0 when nothing is pending."""
    oldest = oldest_pending_landed_at(paths, stream, table)
    return 0.0 if oldest is None else max(0.0, (time.time() if now is None else now) - oldest)
