"""Full and read-only file systems: the free space of a path, and telling a write the file system
refused (no space, over quota, read-only) from any other failure, whichever layer raised it.

A refused write reaches the code as an ``OSError`` (Python), as the same words in a Java
exception's text (Spark, Hadoop and Iceberg write through the JVM, and a failed Spark job reaches
Python as a ``Py4JJavaError`` or, from the Spark host, as its text) or as SQLite's "database or
disk is full" (the Dagster instance). The JVM and Python both word an errno with the C library's
``strerror``, so one table of words recognises all of them.
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from lakehouse_assets.errors import LakehouseError

STORAGE_EXIT_CODE = 75
"""The exit code of a command stopped by a full or read-only file system (sysexits' EX_TEMPFAIL:
free space, or make the file system writable, and run it again)."""

REFUSING_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
_WORDS = {os.strerror(code): code for code in REFUSING_ERRNOS}
_SQLITE_FULL = "database or disk is full"
_SQLITE_IO = "disk I/O error"
SQLITE_IO_FULL_BELOW_BYTES = 16 * 1024 * 1024
"""SQLite reports a write its journal could not make as a bare "disk I/O error": taken for a full
disk when the database's file system has less than this free (or is read-only)."""
_QUOTED_PATH = re.compile(r"'(/[^']*)'")


@dataclass(frozen=True)
class FileSystemSpace:
    """The file system a path is on: its free bytes (for an unprivileged writer), its size, and
    whether it is mounted read-only. ``path`` is the path asked about."""

    path: Path
    free_bytes: int
    total_bytes: int
    read_only: bool

    def describe(self) -> str:
        """``3.0 MiB free of 160.0 MiB``."""
        return f"{format_bytes(self.free_bytes)} free of {format_bytes(self.total_bytes)}"


def space_of(path: Path) -> FileSystemSpace:
    """The space of the file system ``path`` is on (or would be created on: its nearest existing
    ancestor)."""
    existing = Path(path).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    figures = os.statvfs(existing)
    return FileSystemSpace(
        Path(path),
        figures.f_bavail * figures.f_frsize,
        figures.f_blocks * figures.f_frsize,
        bool(figures.f_flag & os.ST_RDONLY),
    )


def format_bytes(count: int) -> str:
    """``count`` bytes for a person: ``3.0 MiB``, ``812 B``."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


class StorageRefusedError(LakehouseError):
    """Work stopped for the room on a file system: a command ends with its message, and exit code
    ``STORAGE_EXIT_CODE``. Raised as itself when producers are refused to keep room for the
    pipeline (``batches.headroom``)."""


class StorageFullError(StorageRefusedError):
    """A write was refused by a full, over-quota or read-only file system; nothing partial was left."""

    def __init__(self, doing: str, space: FileSystemSpace, code: int, needed_bytes: int | None = None) -> None:
        self.doing = doing
        self.space = space
        self.code = code
        self.needed_bytes = needed_bytes
        super().__init__(doing, space, code, needed_bytes)

    def __str__(self) -> str:
        where = f"{self.doing}: the file system of {self.space.path}"
        if self.code == errno.EROFS:
            return f"{where} is read-only; nothing partial was kept: make it writable and run it again"
        if self.code == errno.EDQUOT:
            condition = "is over its disk quota"
        elif self.needed_bytes is None:
            condition = "is full"
        else:
            condition = f"lacks the {format_bytes(self.needed_bytes)} it needs"
        return f"{where} {condition} ({self.space.describe()}); nothing partial was kept: free space and run it again"


def require_free_bytes(directory: Path, needed_bytes: int, doing: str) -> None:
    """Raise StorageFullError before work that writes about ``needed_bytes`` under ``directory``
    starts, when its file system is read-only or has less free, so that a full disk fails it
    before it leaves a partial file, not in the middle."""
    space = space_of(directory)
    if space.read_only:
        raise StorageFullError(doing, space, errno.EROFS)
    if space.free_bytes < needed_bytes:
        raise StorageFullError(doing, space, errno.ENOSPC, needed_bytes)


class RefusedWrite(NamedTuple):
    """A write a file system refused: the errno, the path when the error names it, and whether the
    error says so outright (SQLite's bare "disk I/O error" does not)."""

    code: int
    path: Path | None
    certain: bool = True


def refused_write(error: BaseException | str) -> RefusedWrite | None:
    """The write the file system refused somewhere in ``error`` (its causes and contexts
    included), or None when it holds none."""
    seen: set[int] = set()
    pending: list[BaseException | str] = [error]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in REFUSING_ERRNOS:
            return RefusedWrite(current.errno, Path(current.filename) if isinstance(current.filename, str) else None)
        text = str(current)
        for words, code in _WORDS.items():
            if words in text:
                quoted = _QUOTED_PATH.search(text[text.index(words) :])
                return RefusedWrite(code, Path(quoted.group(1)) if quoted else None)
        if _SQLITE_FULL in text:
            return RefusedWrite(errno.ENOSPC, None)
        if isinstance(current, sqlite3.OperationalError) and _SQLITE_IO in text:
            return RefusedWrite(errno.ENOSPC, None, certain=False)
        if isinstance(current, BaseException):
            pending += [linked for linked in (current.__cause__, current.__context__) if linked is not None]
    return None


def storage_failure(error: BaseException | str, doing: str, written: Iterable[Path]) -> StorageFullError | None:
    """``error`` as a StorageFullError when a file system refused one of its writes, else None.
    ``written``: the directories the failed work writes to, for an error that does not name its
    path (a Java one rarely does): the read-only one, else the one with the least free space."""
    if isinstance(error, StorageFullError):
        return error
    refused = refused_write(error)
    if refused is None:
        return None
    if refused.path is not None:
        return StorageFullError(doing, space_of(refused.path), refused.code)
    spaces = [space_of(directory) for directory in written]
    if not spaces:
        return None
    space = min(spaces, key=lambda candidate: (not candidate.read_only, candidate.free_bytes))
    if not refused.certain and not space.read_only and space.free_bytes >= SQLITE_IO_FULL_BELOW_BYTES:
        return None
    return StorageFullError(doing, space, errno.EROFS if space.read_only else refused.code)


@contextmanager
def named_storage_failures(doing: str, written: Iterable[Path]) -> Iterator[None]:
    """Raise a write a file system refused inside as a StorageFullError (the error its cause),
    naming ``doing``, the path and its free space: what a run's failure shows first in the UI."""
    try:
        yield
    except StorageFullError:
        raise
    except Exception as error:
        full = storage_failure(error, doing, written)
        if full is None:
            raise
        raise full from error
