"""Room on the storage root: the landed bytes not committed yet, what committing them needs, and
when producers are refused so that a landing zone filling the disk can never block its own drain.

Committing a landed batch writes its rows again as Parquet (the staged batch or the table's data
files): measured on the demo's orders, a fifth of the landed NDJSON bytes. Producers are refused
while the storage root's free space is below ``storage.min_free_bytes`` (Spark's scratch, the
metadata, the Dagster instance) plus half the backlog: room for the pipeline to commit all of it,
with a margin for events that compress less well. Spark's scratch (where it spills and shuffles)
counts too: when it is on another file system, the tighter of the two decides.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lakehouse_assets.batches.landing import landing_dir, list_landing_files
from lakehouse_assets.batches.ledger import COMMITTED_FILE, StreamLedger
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.storage_space import FileSystemSpace, format_bytes, space_of

COMMIT_BYTES_PER_LANDED_BYTE = 0.5
"""What committing a landed byte may write, with a margin (measured: 0.17 for the demo's orders)."""
SPARK_SCRATCH_ENV = "SPARK_LOCAL_DIRS"
SPARK_SCRATCH_SETTING = "spark.local.dir"
JVM_TEMPORARY_DIRECTORY = "/tmp"
"""The JVM's ``java.io.tmpdir`` on Linux and macOS: Spark's scratch when nothing else names one."""


def spark_scratch_dirs(spark_settings: dict[str, str]) -> list[Path]:
    """Spark's scratch directories on this machine, chosen as Spark chooses them for a local
    driver: ``$SPARK_LOCAL_DIRS``, else the ``spark.local.dir`` setting, else the JVM's temporary
    directory (comma-separated lists in both)."""
    chosen = os.environ.get(SPARK_SCRATCH_ENV) or spark_settings.get(SPARK_SCRATCH_SETTING) or JVM_TEMPORARY_DIRECTORY
    return [Path(directory) for directory in chosen.split(",") if directory]


def uncommitted_landing_bytes(paths: LakehousePaths, stream: StreamSpec) -> int:
    """The bytes of the stream's landed files that no committed batch holds, from the landing zone
    and the staging ledger alone (no table is read): what a stopped or slow pipeline lets grow."""
    ledger = StreamLedger(paths.staging(stream.name))
    # Each landing file is in one batch at most: the claimed ones less those of uncommitted batches
    # (read second, so a batch minted in between counts as uncommitted).
    claimed = ledger.claimed_files()
    uncommitted = [record for record in ledger.batches(lacking=COMMITTED_FILE) if record.committed is None]
    committed = claimed - {name for record in uncommitted for name in record.minted.files}
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
    scratch: tuple[FileSystemSpace, ...] = ()
    """The file systems of Spark's scratch directories (``spark_scratch_dirs``)."""

    @property
    def needed_bytes(self) -> int:
        """``storage.min_free_bytes`` plus what committing the backlog may write."""
        return self.min_free_bytes + commit_bytes(self.backlog_bytes)

    @property
    def tightest(self) -> FileSystemSpace:
        """Of the storage root's and Spark's scratch's file systems, the one with the least room."""
        return min((self.space, *self.scratch), key=lambda space: space.free_bytes)

    def producer_refusal(self) -> str | None:
        """Why producers may land nothing now, or None (a read-only file system refuses the write itself)."""
        tightest = self.tightest
        if self.space.read_only or tightest.free_bytes >= self.needed_bytes:
            return None
        where = "the storage root" if tightest is self.space else "Spark's scratch directory"
        return (
            f"{where} {tightest.path} has {tightest.describe()}, below the "
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
            "spark_scratch": ",".join(str(space.path) for space in self.scratch),
            "spark_scratch_free_bytes": min(
                (space.free_bytes for space in self.scratch), default=self.space.free_bytes
            ),
        }


def storage_room(
    paths: LakehousePaths, streams: list[StreamSpec], min_free_bytes: int, scratch_dirs: list[Path]
) -> StorageRoom:
    """The storage room now: a ``statvfs`` of the storage root and of each of Spark's
    ``scratch_dirs``, and a listing of each stream's landing zone and ledger (``Lakehouse.storage_room``)."""
    backlog = sum(uncommitted_landing_bytes(paths, stream) for stream in streams)
    scratch = tuple(space_of(directory) for directory in scratch_dirs)
    return StorageRoom(space_of(paths.storage), backlog, min_free_bytes, scratch)
