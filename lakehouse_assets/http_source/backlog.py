"""A stream's backlog as the server sees it: landed bytes that no committed batch holds yet."""

from __future__ import annotations

from lakehouse_assets.batches.landing import landing_dir, list_landing_files
from lakehouse_assets.batches.ledger import StreamLedger
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.paths import LakehousePaths


def uncommitted_landing_bytes(paths: LakehousePaths, stream: StreamSpec) -> int:
    """The bytes of the stream's landed files that no committed batch holds, from the landing zone
    and the staging ledger alone (no table is read): what a stopped or slow pipeline lets grow."""
    committed = {
        name
        for record in StreamLedger(paths.staging(stream.name)).batches()
        if record.committed is not None
        for name in record.minted.files
    }
    return sum(landed.size for landed in list_landing_files(landing_dir(paths, stream)) if landed.name not in committed)
