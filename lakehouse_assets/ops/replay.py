"""Dead-letter replay: send dead letters back through their stream after a fix, exactly once.

``lakehouse dlq replay --table T [--reason TEXT]`` lands the selected dead letters as new landing
files of their streams. Before a file becomes visible, a sidecar ``.<file>.replay.json`` names the
dead-letter row of each of its lines (stream, batch, source file and line). The file is batched,
staged and committed like any other; the dead-letter commit of its batch deletes the replayed rows
and inserts the events that fail again, with their new reason, in one commit, before the table
commit places the others (each table's ancestry says whether its part is done, as for every
batch). Dead letters already named by a pending replay file are not replayed twice; replays of
one stream hold its replay lock from reading the dead letters to landing them, so two replays at
once cannot both choose the same dead letters.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from pyiceberg.expressions import EqualTo, Reference
from pyiceberg.expressions.literals import literal

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import landing_dir, list_landing_files, validated_lines, write_landing_file
from lakehouse_assets.commit.dead_letters import DeadLetterKey, dead_letter_identifier, replayed_keys, sidecar_path
from lakehouse_assets.config.spec import LakehouseConfig, StreamSpec
from lakehouse_assets.errors import ConfigError, IngestError
from lakehouse_assets.faults import crash_point
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.locks import exclusive_lock, replay_lock_file

EVENTS_PER_FILE = 100_000


@dataclass(frozen=True)
class ReplayReport:
    """What a replay landed, per stream, and what it left alone."""

    landed: dict[str, int]
    already_pending: int
    not_replayable: int


def _pending_keys(directory: Path) -> set[DeadLetterKey]:
    return set(replayed_keys(directory, [landed.name for landed in list_landing_files(directory)]))


def _write_sidecar(keys: list[DeadLetterKey]):
    def write(landing_file: Path) -> None:
        sidecar = sidecar_path(landing_file)
        temporary = sidecar.with_name(sidecar.name + ".tmp")
        temporary.write_text(json.dumps([asdict(key) for key in keys]))
        os.replace(temporary, sidecar)

    return write


def _dead_letters_of(config: LakehouseConfig, table_identifier: str) -> tuple[str, dict[str, StreamSpec]]:
    """The dead-letter table behind ``--table`` and the streams whose dead letters it holds: a
    table's streams, or a router (named by its dead-letter table) whose events could not be routed."""
    routers = {stream.router_dead_letter_identifier: stream for stream in config.routers()}
    if table_identifier in routers:
        return table_identifier, {routers[table_identifier].name: routers[table_identifier]}
    if table_identifier not in config.tables:
        known = ", ".join([*config.tables, *routers])
        raise ConfigError(f"unknown table {table_identifier!r}; configured tables: {known}")
    streams = {stream.name: stream for stream in config.tables[table_identifier]}
    return dead_letter_identifier(table_identifier), streams


def replay_dead_letters(lake: Lakehouse, table_identifier: str, reason: str | None = None) -> ReplayReport:
    """Land the table's dead letters (those whose reason contains ``reason``) for another try;
    ``table_identifier`` may also be a router's dead-letter table (``lakehouse.<stream>_dead_letters``).

    Each stream's dead letters are read, chosen and landed under the stream's replay lock."""
    identifier, streams = _dead_letters_of(lake.config, table_identifier)
    landed: dict[str, int] = {}
    already_pending = not_replayable = 0
    for name, stream in streams.items():
        directory = landing_dir(lake.paths, stream)
        with exclusive_lock(replay_lock_file(lake.paths.locks, name)):
            table = lake.table(identifier)
            rows = (
                table.scan(row_filter=EqualTo(term=Reference("stream"), value=literal(name))).to_arrow().to_pylist()
                if table
                else []
            )
            pending = _pending_keys(directory)
            selected: list[tuple[DeadLetterKey, bytes]] = []
            for row in rows:
                if reason and reason not in row["reason"]:
                    continue
                key = DeadLetterKey(name, row["batch_sequence"], row["source_file"], row["source_line"])
                if key in pending:
                    already_pending += 1
                    continue
                try:
                    [line] = validated_lines([row["event"]], "dead letter")
                except (IngestError, ValueError):
                    not_replayable += 1  # not a JSON object: it can only ever be a dead letter
                    continue
                selected.append((key, line))
            crash_point(faults.REPLAY_AFTER_SELECTING)
            for start in range(0, len(selected), EVENTS_PER_FILE):
                chunk = selected[start : start + EVENTS_PER_FILE]
                write_landing_file(directory, [line for _, line in chunk], _write_sidecar([key for key, _ in chunk]))
        if selected:
            landed[name] = len(selected)
    return ReplayReport(landed, already_pending, not_replayable)
