"""The landing files of a stream that no batch holds yet: what the next batch may take."""

from __future__ import annotations

from pyiceberg.table import Table

from lakehouse_assets.batches.landing import LandingFile, landing_dir, list_landing_files
from lakehouse_assets.batches.ledger import StreamLedger
from lakehouse_assets.commit.recovery import AUDIT_BRANCH, committed_landing_files
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.paths import LakehousePaths


def pending_files(
    paths: LakehousePaths, stream: StreamSpec, ledger: StreamLedger, table: Table | None
) -> list[LandingFile]:
    """Landed files that no minted batch holds yet and that no commit of the stream in ``table``
    names (main, and the audit branch of an audited stream)."""
    claimed = ledger.claimed_files() | committed_landing_files(table, stream.name)
    if stream.publish == "audit":
        claimed |= committed_landing_files(table, stream.name, AUDIT_BRANCH)
    return [landed for landed in list_landing_files(landing_dir(paths, stream)) if landed.name not in claimed]
