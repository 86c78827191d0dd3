"""The ``Idempotency-Key``s of a stream's landed requests, kept durably for a window.

A key's record is appended (and fsynced) to the stream's journal *before* its landing file is
renamed into place, naming that file. A record is therefore valid exactly when its file's
temporary dot-name no longer exists: the rename happened, the events are landed. A server that
was killed between the two leaves the temporary file, and its next start drops the record and the
file (the request was never acknowledged, so its client retries). One server per storage root
writes a stream's journal (``server.py`` holds a lock), so nothing else renames those files.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lakehouse_assets.batches.landing import HTTP_MARK, fsync_directory, temporary_name

LOG = logging.getLogger("lakehouse.http")


@dataclass(frozen=True)
class Acknowledgement:
    """What a landed request was answered: its events, the file they are in, when, and the
    digest of its body (a retry with the same key and another body is refused)."""

    events: int
    landing_file: str
    at: float
    body_digest: str


class IdempotencyJournal:
    """One stream's remembered keys (by digest): in memory, and in an append-only journal file."""

    def __init__(self, path: Path, landing_directory: Path, window: float) -> None:
        self.path = path
        self.landing_directory = landing_directory
        self.window = window
        self._acknowledged: dict[str, Acknowledgement] = {}
        self._records_in_file = 0
        self._lock = threading.Lock()  # the event loop reads and expires; the writer thread adds

    def load(self, now: float) -> None:
        """Read the journal, keep the valid records within the window, remove what a killed
        server left half-landed, and write the journal again with only what it keeps."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept: dict[str, Acknowledgement] = {}
        if self.path.exists():
            with open(self.path, "rb") as journal:
                for line in journal:
                    record = _parsed(line)
                    if record is None:  # the torn tail of an append a crash cut short
                        continue
                    key, acknowledgement = record
                    if acknowledgement.at + self.window > now and self._landed(acknowledgement.landing_file):
                        kept[key] = acknowledgement
        self._acknowledged = kept
        # The journal without the dropped records first: were they still in it when their files
        # are removed, a later start would take them for landed.
        self._rewrite()
        for leftover in self.landing_directory.glob(f".*-{HTTP_MARK}-*.tmp"):
            leftover.unlink(missing_ok=True)

    def _landed(self, landing_file: str) -> bool:
        return not (self.landing_directory / temporary_name(landing_file)).exists()

    def get(self, key: str) -> Acknowledgement | None:
        """The first acknowledgement of ``key`` within the window, or None."""
        with self._lock:
            acknowledgement = self._acknowledged.get(key)
        if acknowledgement is None or acknowledgement.at + self.window <= time.time():
            return None
        return acknowledgement

    def append(self, records: dict[str, Acknowledgement]) -> None:
        """Add records durably (fsynced); on failure the journal is cut back to what it held."""
        if not records:
            return
        payload = b"".join(_line(key, acknowledgement) for key, acknowledgement in records.items())
        with open(self.path, "ab") as journal:
            size_before = journal.tell()
            try:
                journal.write(payload)
                journal.flush()
                os.fsync(journal.fileno())
            except OSError:
                journal.truncate(size_before)
                raise
        self._records_in_file += len(records)

    def remember(self, records: dict[str, Acknowledgement]) -> None:
        """Serve ``records`` from memory, once their files are landed; compact the journal when
        it holds many more records than are still within the window."""
        with self._lock:
            self._acknowledged.update(records)
            expired = self._records_in_file > max(10_000, 2 * len(self._acknowledged))
        if expired:
            self.expire(time.time())
            try:
                self._rewrite()
            except OSError as error:  # housekeeping: the records are landed and kept in the journal
                LOG.warning("could not compact %s: %s", self.path, error)

    def expire(self, now: float) -> None:
        """Forget the keys older than the window."""
        with self._lock:
            self._acknowledged = {
                key: acknowledgement
                for key, acknowledgement in self._acknowledged.items()
                if acknowledgement.at + self.window > now
            }

    def _rewrite(self) -> None:
        """Replace the journal by the remembered records (write, fsync, rename)."""
        with self._lock:
            records = dict(self._acknowledged)
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        with open(temporary, "wb") as journal:
            journal.writelines(_line(key, acknowledgement) for key, acknowledgement in records.items())
            journal.flush()
            os.fsync(journal.fileno())
        os.rename(temporary, self.path)
        fsync_directory(self.path.parent)
        self._records_in_file = len(records)


def _line(key: str, acknowledgement: Acknowledgement) -> bytes:
    return json.dumps({"key": key, **asdict(acknowledgement)}).encode() + b"\n"


def _parsed(line: bytes) -> tuple[str, Acknowledgement] | None:
    try:
        record = json.loads(line)
        return record.pop("key"), Acknowledgement(**record)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
