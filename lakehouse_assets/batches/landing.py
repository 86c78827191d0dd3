"""The landing zone: immutable NDJSON files per stream, created atomically (write, then rename).

Producers may drop files themselves: any ``*.ndjson`` file whose name does not start with ``.``
counts once it is in the directory, so write it under a dot-name and rename it into place.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

from lakehouse_assets.config.spec import MAX_LANDING_FILE_BYTES, StreamSpec
from lakehouse_assets.errors import IngestError
from lakehouse_assets.paths import LakehousePaths

LANDING_SUFFIX = ".ndjson"


@dataclass(frozen=True)
class LandingFile:
    """One landed file: its name in the stream's landing directory, size and landing time."""

    name: str
    size: int
    landed_at: float


def source_file_prefix(order: int, kind: str, snapshot_id: int) -> str:
    """The name prefix of the landing files an Iceberg source writes for one source snapshot
    (``kind``: ``load`` or ``changes``); ``order`` sorts snapshots in commit order."""
    return f"{order:020d}-{kind}-{snapshot_id}"


def source_snapshot_of(landing_file: str) -> int | None:
    """The source snapshot a landing file of an Iceberg source holds events of, from its name."""
    parts = landing_file.split("-")
    return int(parts[2]) if len(parts) == 4 and parts[1] in ("load", "changes") else None


def landing_dir(paths: LakehousePaths, stream: StreamSpec) -> Path:
    """The stream's landing directory: ``source.landing.path`` or ``$LAKEHOUSE_HOME/landing/<stream>``."""
    configured = stream.source.landing.path if stream.source.landing else None
    return Path(configured).resolve() if configured else paths.landing(stream.name)


def list_landing_files(directory: Path) -> list[LandingFile]:
    """All landed files, oldest name first; temporary dot-files are not landed yet, and neither is
    anything but a regular file (a FIFO, a directory or a dangling link with a landing file's name
    would otherwise be batched and fail its batch as lost, holding the stream back)."""
    if not directory.is_dir():
        return []
    files = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith(".") or not entry.name.endswith(LANDING_SUFFIX):
                continue
            try:
                if not entry.is_file():
                    continue
                stat = entry.stat()
            except FileNotFoundError:  # removed meanwhile (retention, another host)
                continue
            files.append(LandingFile(entry.name, stat.st_size, stat.st_mtime))
    return sorted(files, key=lambda landed: landed.name)


HTTP_MARK = "http"
"""Landing files written by ``lakehouse serve`` are named ``<time>-http-<events>-<id>.ndjson``."""


def new_landing_name(http_events: int | None = None) -> str:
    """A fresh landing file name, sorting by landing time; ``http_events``: the events of an
    HTTP server's file, kept in its name so a batch can tell what came over HTTP."""
    mark = f"-{HTTP_MARK}-{http_events}" if http_events is not None else ""
    return f"{time.time_ns():020d}{mark}-{uuid.uuid4().hex[:12]}{LANDING_SUFFIX}"


def http_events_in(file_names: Iterable[str]) -> tuple[int, int]:
    """How many of ``file_names`` came over HTTP, and the events they hold."""
    files = events = 0
    for name in file_names:
        parts = name.split("-")
        if len(parts) == 4 and parts[1] == HTTP_MARK and parts[2].isdigit():
            files += 1
            events += int(parts[2])
    return files, events


def temporary_name(final_name: str) -> str:
    """The dot-name a landing file is written under before it is renamed to ``final_name``."""
    return f".{final_name}.tmp"


def write_landing_file(
    directory: Path,
    lines: Iterable[bytes],
    before_publish: Callable[[Path], None] | None = None,
    name: str | None = None,
) -> Path:
    """Write one landing file under a dot-name, fsync it, rename it into place (``name``, default
    a fresh one) and fsync the directory, so a landed file survives a power cut. ``before_publish``
    runs with the final path before the rename, so whatever it writes exists before the file is seen."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / (name or new_landing_name())
    temporary = directory / temporary_name(final.name)
    try:
        with open(temporary, "wb") as handle:
            handle.writelines(lines)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        temporary.unlink(missing_ok=True)  # a full disk is not filled further by retries
        error.filename = error.filename or str(temporary)  # a failed write() names no file
        raise
    if before_publish:
        before_publish(final)
    os.rename(temporary, final)
    fsync_directory(directory)
    return final


def fsync_directory(directory: Path) -> None:
    """Make the directory's entries (a rename into it) durable."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def validated_lines(lines: Iterable[bytes | str], origin: str) -> list[bytes]:
    """The non-empty lines as newline-terminated bytes; IngestError names the first that is not a JSON object."""
    lines = list(lines)
    try:
        return _objects_quickly(lines)
    except (orjson.JSONDecodeError, TypeError):
        return _validated_line_by_line(lines, origin)


def _objects_quickly(lines: list[bytes | str]) -> list[bytes]:
    """The same result as :func:`_validated_line_by_line` for byte lines orjson reads as objects,
    several times faster (what lets ``lakehouse serve`` keep up). orjson refuses a subset of what
    ``json`` accepts (NaN, lone surrogates, numbers beyond a double): any refusal, a line that is not
    an object, or text lines (TypeError) go the exact way, which also names the bad line."""
    filled = [line for line in lines if line.strip()]
    if set(map(type, map(orjson.loads, filled))) - {dict}:  # loops in C
        raise TypeError("a line is not an object")
    return [line.rstrip(b"\r\n") + b"\n" for line in filled]  # type: ignore[operator, arg-type, misc]


def _validated_line_by_line(lines: list[bytes | str], origin: str) -> list[bytes]:
    accepted: list[bytes] = []
    for number, line in enumerate(lines, start=1):
        try:
            text = line.decode("utf-8") if isinstance(line, bytes) else line
        except UnicodeDecodeError as error:
            raise IngestError(
                f"{origin} line {number}: not UTF-8 (byte {error.start + 1}); nothing was landed"
            ) from None
        if not text.strip():
            continue
        try:
            event = json.loads(text)
        except json.JSONDecodeError as error:
            raise IngestError(f"{origin} line {number}: not valid JSON ({error.msg}); nothing was landed") from None
        except ValueError as error:  # an integer of more digits than Python converts
            raise IngestError(f"{origin} line {number}: not valid JSON ({error}); nothing was landed") from None
        except RecursionError:
            raise IngestError(f"{origin} line {number}: JSON nested too deeply; nothing was landed") from None
        if not isinstance(event, dict):
            raise IngestError(f"{origin} line {number}: expected a JSON object; nothing was landed")
        accepted.append(text.rstrip("\r\n").encode("utf-8") + b"\n")
    return accepted


def land_events(
    paths: LakehousePaths,
    stream: StreamSpec,
    lines: Iterable[bytes | str],
    origin: str = "input",
) -> list[Path]:
    """Validate NDJSON lines and land them as new immutable files; all or nothing.

    Every line must be a JSON object; the first bad line is named in the error and nothing is
    landed. Large inputs are split into files of at most 64 MiB.
    """
    accepted = validated_lines(lines, origin)
    directory = landing_dir(paths, stream)
    chunks: list[list[bytes]] = [[]]
    chunk_bytes = 0
    for line in accepted:
        if chunks[-1] and chunk_bytes + len(line) > MAX_LANDING_FILE_BYTES:
            chunks.append([])
            chunk_bytes = 0
        chunks[-1].append(line)
        chunk_bytes += len(line)
    return [write_landing_file(directory, chunk) for chunk in chunks if chunk]
