"""Room on the storage root: the landed bytes not committed yet, what committing them needs, and
when producers are refused so that a landing zone filling the disk can never block its own drain.

Committing a landed batch writes its rows again as Parquet (the staged batch or the table's data
files): measured on the demo's orders, a fifth of the landed NDJSON bytes. Producers are refused
while the storage root's free space is below ``storage.min_free_bytes`` (Spark's scratch, the
metadata, the Dagster instance) plus half the backlog: room for the pipeline to commit all of it,
with a margin for events that compress less well.
"""

from __future__ import annotations

from dataclasses import dataclass

from lakehouse_assets.batches.landing import landing_dir, list_landing_files
from lakehouse_assets.batches.ledger import StreamLedger
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.storage_space import FileSystemSpace, format_bytes, space_of

COMMIT_BYTES_PER_LANDED_BYTE = 0.5
"""What committing a landed byte may write, with a margin (measured: 0.17 for the demo's orders)."""


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


def commit_bytes(landed_bytes: int) -> int:
    """What committing ``landed_bytes`` of landed events may write (``COMMIT_BYTES_PER_LANDED_BYTE``)."""
    return int(landed_bytes * COMMIT_BYTES_PER_LANDED_BYTE)


@dataclass(frozen=True)
class StorageRoom:
    """The storage root's space, the landed bytes of every stream not committed yet, and the
    free space below which producers are refused."""

    space: FileSystemSpace
    backlog_bytes: int
    min_free_bytes: int

    @property
    def needed_bytes(self) -> int:
        """``storage.min_free_bytes`` plus what committing the backlog may write."""
        return self.min_free_bytes + commit_bytes(self.backlog_bytes)

    def producer_refusal(self) -> str | None:
        """Why producers may land nothing now, or None (a read-only file system refuses the write itself)."""
        if self.space.read_only or self.space.free_bytes >= self.needed_bytes:
            return None
        return (
            f"the storage root {self.space.path} has {self.space.describe()}, below the "
            f"{format_bytes(self.needed_bytes)} kept free (storage.min_free_bytes "
            f"{format_bytes(self.min_free_bytes)} plus {format_bytes(commit_bytes(self.backlog_bytes))} to commit "
            f"the {format_bytes(self.backlog_bytes)} landed and not committed yet); nothing was landed. The "
            "pipeline goes on committing: retry once it has, or free space"
        )

    def as_status(self) -> dict[str, int | bool | str]:
        """The figures ``lakehouse status`` and the staging asset's metadata show."""
        return {
            "storage_root": str(self.space.path),
            "storage_free_bytes": self.space.free_bytes,
            "storage_total_bytes": self.space.total_bytes,
            "storage_read_only": self.space.read_only,
            "backlog_bytes": self.backlog_bytes,
            "backlog_commit_bytes": commit_bytes(self.backlog_bytes),
            "producers_refused_below_bytes": self.needed_bytes,
        }


def storage_room(paths: LakehousePaths, streams: list[StreamSpec], min_free_bytes: int) -> StorageRoom:
    """The storage room now: a ``statvfs`` and a listing of each stream's landing zone and ledger
    (``Lakehouse.storage_room``)."""
    backlog = sum(uncommitted_landing_bytes(paths, stream) for stream in streams)
    return StorageRoom(space_of(paths.storage), backlog, min_free_bytes)
