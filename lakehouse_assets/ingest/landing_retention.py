"""Landing-zone retention: remove landing files once no failure or rollback could need them again.

A landing file is needed as long as its batch might be staged again: until the batch is committed,
and after that for as long as the table could be rolled back to a snapshot before its commit. The
maintenance checkpoint marks the oldest snapshot that can still be rolled back to, so a file goes
only when every batch holding it is at or below the checkpoint's sequence for its stream and was
committed longer ago than the stream's ``maintenance.landing_retention``. The batch's ledger entry
goes with its files, so the ledger stays as small as the landing zone.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.table import Table

from lakehouse_assets.batches.landing import landing_dir
from lakehouse_assets.batches.ledger import StreamLedger
from lakehouse_assets.commit.recovery import table_history
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.paths import LakehousePaths


def remove_committed_landing_files(
    paths: LakehousePaths, stream: StreamSpec, table: Table | None, now: float
) -> dict[str, Any]:
    """Delete the stream's landing files that are past retention and beyond any rollback."""
    beyond_rollback = table_history(table).base_sequence(stream.name)
    cutoff = now - stream.maintenance.landing_retention
    directory = landing_dir(paths, stream)
    ledger = StreamLedger(paths.staging(stream.name))
    removed, forgotten, kept_for_retention = 0, 0, 0
    ledger.sweep_removed()
    for record in ledger.batches():
        if record.sequence > beyond_rollback or record.committed is None:
            break
        if record.committed.committed_at > cutoff:
            kept_for_retention += 1
            continue
        for name in record.minted.files:
            try:
                (directory / name).unlink()
                removed += 1
            except FileNotFoundError:  # removed before, here or by another host's maintenance
                pass
        # With its files gone the ledger entry can never be used again; the table holds the sequence.
        ledger.remove_batch(record.sequence)
        forgotten += 1
    return {
        "landing_files_removed": removed,
        "ledger_entries_removed": forgotten,
        "batches_within_retention": kept_for_retention,
    }
