"""The staging ledger of one stream: which landing files each batch sequence holds, and its state.

Layout under ``$LAKEHOUSE_HOME/staging/<stream>/<sequence>/``:

- ``batch.json``: minted by the micro-batch sensor (the exact landing files of the batch);
- ``attempt-<id>/events/``: Parquet written by one writer attempt (rows and rejected events, or
  only the rejected events when the rows went into a staged snapshot of the table);
- ``staged.json``: the attempt that won, with row counts and event-time range (created once);
- ``committed.json``: bookkeeping after the commit; the table's snapshot ancestry stays the truth.

Every record is created atomically; ``batch.json`` and ``staged.json`` are created exclusively,
so two sensors or two writer runs can never produce two versions of one batch. A sequence
directory without ``batch.json`` (a mint that died between the two) is not a batch: the next mint
of that sequence takes the directory over.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lakehouse_assets import faults
from lakehouse_assets.errors import BatchConflictError, LakehouseError
from lakehouse_assets.faults import crash_point

BATCH_FILE = "batch.json"
STAGED_FILE = "staged.json"
COMMITTED_FILE = "committed.json"
EVENTS_DIR = "events"
ATTEMPT_PREFIX = "attempt-"
REMOVED_PREFIX = ".removed-"
SEQUENCE_DIGITS = 10


@dataclass(frozen=True)
class MintedBatch:
    """A batch as the sensor minted it: its sequence and exact landing files."""

    stream: str
    sequence: int
    table: str
    files: list[str]
    bytes: int
    oldest_landed_at: float
    minted_at: float
    offsets: dict[str, list[int]] = field(default_factory=dict)
    """A Kafka stream's batch: ``[start, end)`` offsets per ``<topic>/<partition>``, every known
    partition of the stream (``start == end`` where the batch holds none); no landing files."""

    @property
    def end_offsets(self) -> dict[str, int]:
        """Where each partition's next batch starts (a Kafka stream's batch)."""
        return {name: end for name, (_, end) in self.offsets.items()}

    @property
    def records(self) -> int:
        """Offsets the batch spans (a Kafka stream's; markers and aborted records included)."""
        return sum(end - start for start, end in self.offsets.values())


@dataclass(frozen=True)
class StagedBatch:
    """The writer attempt whose Parquet the committer will publish.

    ``rows`` are rows to append or upsert (after collapsing changes per key), ``deletes`` the keys
    to delete, ``rejected`` the events bound for the dead letters.
    """

    sequence: int
    attempt: str
    rows: int
    rejected: int
    min_event_time: str | None
    max_event_time: str | None
    staged_at: float
    run_id: str | None = None
    deletes: int = 0
    new_columns: dict[str, str] = field(default_factory=dict)
    """Columns the batch's events have and the table lacked, or held in a type too narrow for
    their values (schema evolution), with the types they need."""
    relaxed_columns: list[str] = field(default_factory=list)
    """Required columns the batch's events stop carrying, to make optional (``relax_required``)."""
    schema_id: int | None = None
    """The table's schema the batch was staged against (None: staged before this was recorded)."""
    uncoercible_values: dict[str, int] = field(default_factory=dict)
    """Per optional column, the batch's events whose value for it could not be coerced to its
    type and was staged as NULL."""
    routes: dict[str, int] = field(default_factory=dict)
    """A router's batch: the events it routed to each table."""
    staged_snapshot: int | None = None
    """The table's staged snapshot holding the batch's rows (written once, see ``staging``); None
    when the rows are in the staged Parquet."""
    lost_offsets: dict[str, list[int]] = field(default_factory=dict)
    """A Kafka batch whose first offsets had been deleted from the log when it was staged, with
    ``source.kafka.on_records_lost: skip``: the ``[start, end)`` lost per partition."""


@dataclass(frozen=True)
class CommittedBatch:
    """Bookkeeping after a commit: which snapshot published the batch."""

    snapshot_id: int
    commit_sequence: int
    committed_at: float


@dataclass(frozen=True)
class BatchRecord:
    """Everything the ledger knows of one batch sequence."""

    minted: MintedBatch
    staged: StagedBatch | None = None
    committed: CommittedBatch | None = None
    directory: Path = field(default=Path("."), compare=False)

    @property
    def sequence(self) -> int:
        return self.minted.sequence

    @property
    def status(self) -> str:
        if self.committed:
            return "committed"
        return "staged" if self.staged else "minted"

    @property
    def staged_batch(self) -> StagedBatch:
        """What staging recorded; for callers that only hold staged batches (an error otherwise)."""
        if self.staged is None:
            raise LakehouseError(f"batch {self.sequence} is not staged")
        return self.staged

    def events_path(self) -> Path:
        """The staged Parquet: converted rows, and reasons for the rejected events."""
        return self.directory / f"{ATTEMPT_PREFIX}{self.staged_batch.attempt}" / EVENTS_DIR


def _write_json_atomically(path: Path, payload: dict[str, Any], exclusive: bool) -> bool:
    """Write ``path`` via a temporary file; with ``exclusive`` keep an existing file and return False."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(temporary, "w") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    try:
        if exclusive:
            try:
                os.link(temporary, path)
            except FileExistsError:
                return False
        else:
            os.replace(temporary, path)
            return True
    finally:
        temporary.unlink(missing_ok=True)
    return True


def _read_json(path: Path | str) -> dict[str, Any] | None:
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def _gone(error: OSError) -> bool:
    """Whether ``error`` says the file or directory is no longer there (removed meanwhile, on NFS
    too, where another host's removal shows as a stale handle)."""
    return isinstance(error, (FileNotFoundError, NotADirectoryError)) or error.errno == errno.ESTALE


def exists_when_opened(path: str | Path) -> bool:
    """Whether a file exists, asked by opening it: a shared file system (NFS) answers a ``stat``
    from its attribute cache, which may still hold a file another host removed, but revalidates on
    ``open``, as a read of the file does. Never blocks: a FIFO (a hostile name in a landing
    directory) opens at once, and a terminal does not become this process's."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY))
    except OSError as error:
        if _gone(error):
            return False
        raise
    return True


def _has_attempts(directory: str) -> bool:
    try:
        return any(name.startswith(ATTEMPT_PREFIX) for name in os.listdir(directory))
    except OSError as error:
        if _gone(error):  # the batch was removed meanwhile
            return False
        raise


class StreamLedger:
    """The batches of one stream, read from and written to its staging directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _directory(self, sequence: int) -> Path:
        return Path(self._directory_path(sequence))

    def _directory_path(self, sequence: int) -> str:
        """A sequence's directory as a string: the reads over every batch make no ``Path`` objects."""
        return os.path.join(self.root, f"{sequence:0{SEQUENCE_DIGITS}d}")

    def require(self, sequence: int) -> BatchRecord:
        """The record of one sequence; an error naming it when it was never minted."""
        record = self.batch(sequence)
        if record is None:
            raise LakehouseError(f"batch {sequence} was never minted (staging ledger {self.root})")
        return record

    def batch(self, sequence: int) -> BatchRecord | None:
        """The record of one sequence, or None when it was never minted."""
        directory = self._directory(sequence)
        minted = _read_json(directory / BATCH_FILE)
        if minted is None:
            return None
        staged = _read_json(directory / STAGED_FILE)
        committed = _read_json(directory / COMMITTED_FILE)
        return BatchRecord(
            minted=MintedBatch(**minted),
            staged=StagedBatch(**staged) if staged else None,
            committed=CommittedBatch(**committed) if committed else None,
            directory=directory,
        )

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.root)
        except OSError as error:
            if _gone(error):
                return []
            raise

    def _sequences(self) -> list[int]:
        """The sequences that have a directory, in order (a mint that died may have left one empty)."""
        return sorted(int(name) for name in self._names() if name.isascii() and name.isdigit())

    def batches(self, after: int = 0, lacking: str | None = None, with_attempts: bool = False) -> list[BatchRecord]:
        """The minted batches with a sequence above ``after``, in sequence order; with ``lacking``
        (``STAGED_FILE`` or ``COMMITTED_FILE``) only those without that record, and with
        ``with_attempts`` only those that still hold a writer attempt's directory.

        The ledger keeps a week of committed batches, so only the batches that pass are read (the
        filters look at names, not contents): a caller that needs the open tail reads the tail.
        """
        selected = []
        for sequence in self._sequences():
            if sequence <= after:
                continue
            directory = self._directory_path(sequence)
            if lacking and exists_when_opened(os.path.join(directory, lacking)):
                continue
            if with_attempts and not _has_attempts(directory):
                continue
            selected.append(sequence)
        records = (self.batch(sequence) for sequence in selected)
        return [record for record in records if record is not None]

    def latest(self) -> BatchRecord | None:
        """The batch with the highest sequence, reading only its record (None: no batch)."""
        records = (self.batch(sequence) for sequence in reversed(self._sequences()))
        return next((record for record in records if record is not None), None)

    def claimed_files(self) -> set[str]:
        """Landing files that belong to a minted batch, committed or not (only ``batch.json`` is read)."""
        claimed: set[str] = set()
        for sequence in self._sequences():
            minted = _read_json(os.path.join(self._directory_path(sequence), BATCH_FILE))
            claimed.update(minted["files"] if minted else ())
        return claimed

    def highest_sequence(self) -> int:
        """The highest minted sequence, 0 when none is."""
        latest = self.latest()
        return latest.sequence if latest else 0

    def mint(self, batch: MintedBatch) -> None:
        """Create the batch record; raises BatchConflictError if the sequence was minted already.

        The directory of a mint that died before writing ``batch.json`` is reused: it holds no
        batch, and ``batches()`` (so the next sequence) does not see it.
        """
        directory = self._directory(batch.sequence)
        directory.mkdir(parents=True, exist_ok=True)
        crash_point(faults.LEDGER_AFTER_DIRECTORY)
        if not _write_json_atomically(directory / BATCH_FILE, asdict(batch), exclusive=True):
            raise BatchConflictError(f"stream {batch.stream!r}: batch {batch.sequence} was minted already")

    def new_attempt(self, sequence: int) -> tuple[str, Path]:
        """A fresh attempt id and its directory; attempts never share file names."""
        attempt = uuid.uuid4().hex[:16]
        return attempt, self._directory(sequence) / f"{ATTEMPT_PREFIX}{attempt}"

    def record_staged(self, staged: StagedBatch) -> bool:
        """Publish an attempt as the staged batch; False when another attempt won first."""
        return _write_json_atomically(
            self._directory(staged.sequence) / STAGED_FILE,
            asdict(staged),
            exclusive=True,
        )

    def record_committed(self, sequence: int, committed: CommittedBatch) -> None:
        _write_json_atomically(
            self._directory(sequence) / COMMITTED_FILE,
            asdict(committed),
            exclusive=False,
        )

    def reset_to_minted(self, sequence: int) -> None:
        """Forget that a batch was staged and committed, so it can be staged again from its files."""
        directory = self._directory(sequence)
        (directory / COMMITTED_FILE).unlink(missing_ok=True)
        (directory / STAGED_FILE).unlink(missing_ok=True)
        self.remove_attempts(sequence)

    def forget_staged_data(self, sequence: int) -> None:
        """Forget a batch's commit and remove its staged Parquet: the committer stages it again
        from its landing files before committing it."""
        (self._directory(sequence) / COMMITTED_FILE).unlink(missing_ok=True)
        self.remove_attempts(sequence)

    def remove_batch(self, sequence: int) -> None:
        """Forget a batch entirely; only for batches no failure or rollback can need again.

        The directory is first renamed out of the ledger's sight, so a removal cut short never
        leaves a batch that lost its ``committed.json`` but kept its ``batch.json`` (one that looks
        unstaged, whose landing files are gone); ``sweep_removed`` deletes what such a cut left.
        """
        removed = os.path.join(self.root, f"{REMOVED_PREFIX}{sequence}-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(self._directory_path(sequence), removed)
        except OSError as error:
            if _gone(error):  # removed before, here or by another host
                return
            raise
        crash_point(faults.LEDGER_DURING_REMOVAL)
        shutil.rmtree(removed, ignore_errors=True)

    def sweep_removed(self) -> None:
        """Delete the directories of removals that were cut short (``remove_batch``)."""
        for name in self._names():
            if name.startswith(REMOVED_PREFIX):
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

    def remove_attempts(self, sequence: int, keep: str | None = None) -> None:
        """Delete attempt directories of a batch, except ``keep``."""
        directory = self._directory(sequence)
        if not directory.is_dir():
            return
        for entry in directory.iterdir():
            if entry.is_dir() and entry.name.startswith(ATTEMPT_PREFIX) and entry.name != f"{ATTEMPT_PREFIX}{keep}":
                shutil.rmtree(entry, ignore_errors=True)
