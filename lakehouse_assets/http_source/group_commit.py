"""Group commit: the requests that arrive while one landing file is being written land together in
the next, so many concurrent requests share one file and one fsync.

A request's events always land in one file (whole requests per file), so a crash lands all of a
request or none of it; a request is answered only after its file is renamed into place and the
directory fsynced.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import fsync_directory, new_landing_name, temporary_name, write_landing_file
from lakehouse_assets.config.spec import MAX_LANDING_FILE_BYTES
from lakehouse_assets.http_source.idempotency import Acknowledgement, IdempotencyJournal


@dataclass
class _Queued:
    lines: list[bytes]
    size: int
    body_digest: str
    key: str | None
    answer: asyncio.Future[Acknowledgement] = field(repr=False)


class GroupCommit:
    """The landing of one stream's requests, one file per group of queued requests."""

    def __init__(self, directory: Path, journal: IdempotencyJournal) -> None:
        self.directory = directory
        self.journal = journal
        self._queue: list[_Queued] = []
        self._writer: asyncio.Task[None] | None = None
        self.queued_bytes = 0

    async def land(self, lines: list[bytes], body_digest: str, key: str | None) -> Acknowledgement:
        """Land ``lines`` (one request's events) and return once they are durable; ``key``: the
        digest of its Idempotency-Key, journaled with the file."""
        size = sum(map(len, lines))
        answer: asyncio.Future[Acknowledgement] = asyncio.get_running_loop().create_future()
        self._queue.append(_Queued(lines, size, body_digest, key, answer))
        self.queued_bytes += size
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_queued())
        # Shielded: a request whose client went away still lands (its file holds other requests too).
        return await asyncio.shield(answer)

    async def _write_queued(self) -> None:
        while self._queue:
            group = _take_group(self._queue)
            del self._queue[: len(group)]
            try:
                acknowledgements = await asyncio.to_thread(self._land_group, group)
            except Exception as error:  # noqa: BLE001 - every queued request is answered, whatever failed
                for queued in group:
                    queued.answer.set_exception(error)
            else:
                for queued, acknowledgement in zip(group, acknowledgements, strict=True):
                    queued.answer.set_result(acknowledgement)
            finally:
                self.queued_bytes -= sum(queued.size for queued in group)

    def _land_group(self, group: list[_Queued]) -> list[Acknowledgement]:
        name = new_landing_name(http_events=sum(len(queued.lines) for queued in group))
        now = time.time()
        acknowledgements = [Acknowledgement(len(queued.lines), name, now, queued.body_digest) for queued in group]
        keyed = {queued.key: ack for queued, ack in zip(group, acknowledgements, strict=True) if queued.key is not None}

        def journal_keys(final: Path) -> None:
            faults.crash_point(faults.HTTP_BEFORE_JOURNAL)
            if keyed:
                try:
                    # The temporary file's own entry must be durable before a record relies on it.
                    fsync_directory(self.directory)
                    self.journal.append(keyed)
                except OSError:
                    # No record names the file (a failed append is cut back): it can go now.
                    (self.directory / temporary_name(final.name)).unlink(missing_ok=True)
                    raise
            faults.crash_point(faults.HTTP_BEFORE_RENAME)

        lines = itertools.chain.from_iterable(queued.lines for queued in group)
        try:
            write_landing_file(self.directory, lines, before_publish=journal_keys, name=name)
        except OSError:
            if not (self.directory / name).exists():
                raise
            # Renamed, and only the directory's fsync failed: the events are in place (durable
            # unless the machine loses power before the kernel writes the directory); answering an
            # error would make a client without a key land them again.
        self.journal.remember(keyed)
        faults.crash_point(faults.HTTP_BEFORE_ACKNOWLEDGING)
        return acknowledgements


def _take_group(queue: list[_Queued]) -> list[_Queued]:
    """The oldest queued requests that fit one landing file (at least one)."""
    group: list[_Queued] = []
    size = 0
    for queued in queue:
        if group and size + queued.size > MAX_LANDING_FILE_BYTES:
            break
        group.append(queued)
        size += queued.size
    return group
