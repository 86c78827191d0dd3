"""The landing files of a stream that no batch holds yet: what the next batch may take."""

from __future__ import annotations

from pyiceberg.table import Table

from lakehouse_assets.batches.landing import LandingFile, landing_dir, list_landing_files
from lakehouse_assets.batches.ledger import StreamLedger, exists_when_opened
from lakehouse_assets.commit.recovery import AUDIT_BRANCH, committed_landing_files
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.paths import LakehousePaths


def pending_files(
    paths: LakehousePaths, stream: StreamSpec, ledger: StreamLedger, table: Table | None
) -> list[LandingFile]:
    """Landed files that no minted batch holds yet and that no commit of the stream in ``table``
    names (main, and the audit branch of an audited stream).

    The table is asked first: when it names every landed file (a stream with nothing new, its
    files kept for ``landing_retention``), no batch's record is read at all; otherwise every
    ``batch.json`` is, since any batch may hold a file (one not committed, or rolled back). A file
    is listed before the batches are read, so each one left is opened once more: retention removes
    a batch's files before its entry, and a file whose entry went in between is gone by then.
    """
    committed = committed_landing_files(table, stream.name)
    if stream.publish == "audit":
        committed |= committed_landing_files(table, stream.name, AUDIT_BRANCH)
    directory = landing_dir(paths, stream)
    landed = [file for file in list_landing_files(directory) if file.name not in committed]
    if not landed:
        return []
    claimed = ledger.claimed_files()
    return [file for file in landed if file.name not in claimed and exists_when_opened(directory / file.name)]
