"""When to cut a Kafka stream's next batch, and minting it: an offset range per partition.

A batch starts in each partition where the stream's previous batch ended: the ledger's newest
batch or, past it, the offsets the table's ancestry records (``lakehouse.kafka-offsets``), so a
lost ledger resumes exactly where the table is. A partition not seen before (a topic or partition
added while the stream runs) starts at its first offset. A batch ends at each partition's last
stable offset, so it never holds a record of an open or aborted transaction.

The trigger is the landing streams' dual trigger over the topic's lag: cut when
``source.kafka.max_records`` offsets are pending or when lag has been seen for ``flush.max_age``.
The time lag was first seen is a note in the stream's ledger directory (``kafka-lag-since``):
only a trigger, never a record of what is committed; losing it restarts the age. Dead letters
replayed into the stream (``lakehouse dlq replay``) are landing files, which the next batch takes
beside its offsets.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyiceberg.table import Table

from lakehouse_assets.batches.ledger import MintedBatch
from lakehouse_assets.commit.recovery import table_history
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.ingest.pending_landing import pending_files
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.locks import exclusive_lock, stream_lock_file
from lakehouse_assets.source.kafka_log import KafkaLog, PartitionLog, split_partition_name

LAG_SINCE_FILE = "kafka-lag-since"
NO_LAG = "no pending records"
PARTITIONS_NAMED = 8
"""How many lagging partitions a skip reason names (``lakehouse status`` lists them all)."""


def stream_positions(
    lake: Lakehouse, stream: StreamSpec, table: Table | None
) -> tuple[dict[str, int], dict[str, int], int]:
    """Where the stream is in each partition: the offsets committed to its ``table``, the offsets
    its next batch starts at (after the newest minted batch), and the highest sequence minted or
    committed."""
    history = table_history(table)
    committed = history.kafka_offsets(stream.name)
    committed_sequence = history.sequence(stream.name)
    latest = lake.ledger(stream.name).latest()
    positions = dict(committed)
    if latest is not None and latest.sequence > committed_sequence:
        for name, end in latest.minted.end_offsets.items():
            positions[name] = max(positions.get(name, end), end)
    return committed, positions, max(committed_sequence, latest.sequence if latest else 0)


def partition_lag(positions: dict[str, int], log: dict[str, PartitionLog]) -> dict[str, list[int]]:
    """``[start, end)`` per partition of the log: from the stream's position (a new partition's
    first offset) to the last stable offset."""
    ranges = {}
    for name, partition in log.items():
        start = positions.get(name, partition.first)
        if start > partition.end:
            raise LakehouseError(
                f"partition {name} ends at offset {partition.end}, before offset {start} the stream already "
                "reached: the topic was deleted and created again? Its offsets start over, which the table's "
                "recorded offsets cannot follow; give the new topic a new stream"
            )
        ranges[name] = [start, partition.end]
    return ranges


def _limited(ranges: dict[str, list[int]], max_records: int) -> dict[str, list[int]]:
    """``ranges`` cut to about ``max_records`` offsets, each lagging partition keeping its share
    of the lag (at least one offset), so no partition starves."""
    pending = sum(end - start for start, end in ranges.values())
    if pending <= max_records:
        return ranges
    return {
        name: [start, start + max(1, (end - start) * max_records // pending) if end > start else start]
        for name, (start, end) in ranges.items()
    }


def describe_lag(committed: dict[str, int], ranges: dict[str, list[int]], limit: int | None = PARTITIONS_NAMED) -> str:
    """Per lagging partition its committed offset and lag, as ``ticks/3 committed 120 lag 40``."""
    lagging = sorted(
        ((name, end - start) for name, (start, end) in ranges.items() if end > start),
        key=lambda item: split_partition_name(item[0]),
    )
    parts = [f"{name} committed {committed.get(name, 0)} lag {lag}" for name, lag in lagging[:limit]]
    if limit is not None and len(lagging) > limit:
        parts.append(f"and {len(lagging) - limit} partitions more")
    return ", ".join(parts)


def _lag_seen_since(directory: Path, now: float) -> float:
    """When lag was first seen (noted now if it was not)."""
    note = directory / LAG_SINCE_FILE
    try:
        return float(note.read_text())
    except (FileNotFoundError, ValueError):
        directory.mkdir(parents=True, exist_ok=True)
        note.write_text(repr(now))
        return now


def mint_next_kafka_batch(
    lake: Lakehouse, stream: StreamSpec, now: float | None = None, drain: bool = False
) -> tuple[MintedBatch | None, str]:
    """Cut and record the stream's next batch if its trigger fires; returns it (or None) and why.

    Holds the stream's minting lock, so two sensors never mint one offset twice."""
    source = stream.kafka_source
    if source is None:
        raise LakehouseError(f"stream {stream.name!r} has no Kafka source")
    ledger = lake.ledger(stream.name)
    with exclusive_lock(stream_lock_file(lake.paths.locks, stream.name)):
        # Asked under the lock: offsets another sensor minted are never past the end read here.
        log = KafkaLog(stream).partitions()
        now = time.time() if now is None else now
        table = lake.table(stream.table_identifier)
        committed, positions, highest = stream_positions(lake, stream, table)
        ranges = partition_lag(positions, log)
        # Dead letters replayed (``lakehouse dlq replay``) land as files: the next batch takes them too.
        replays = pending_files(lake.paths, stream, ledger, table)
        pending = sum(end - start for start, end in ranges.values()) + len(replays)
        if not pending:
            (ledger.root / LAG_SINCE_FILE).unlink(missing_ok=True)
            return None, f"{NO_LAG} in {len(ranges)} partitions"
        since = min([_lag_seen_since(ledger.root, now), *(landed.landed_at for landed in replays)])
        age = now - since
        lag = describe_lag(committed, ranges)
        if pending >= source.max_records:
            reason = f"{pending} records pending >= source.kafka.max_records {source.max_records}"
        elif age >= stream.flush.max_age:
            reason = f"records pending for {age:.1f}s >= flush.max_age {stream.flush.max_age:g}s"
        elif drain:
            reason = "draining every pending record"
        else:
            return None, (
                f"waiting: {pending} records pending (< source.kafka.max_records {source.max_records}) for "
                f"{age:.1f}s (< flush.max_age {stream.flush.max_age:g}s): {lag}"
            )
        offsets = _limited(ranges, source.max_records)
        batch = MintedBatch(
            stream=stream.name,
            sequence=highest + 1,
            table=stream.table_identifier,
            files=[landed.name for landed in replays],
            bytes=sum(landed.size for landed in replays),
            oldest_landed_at=since,
            minted_at=now,
            offsets=offsets,
        )
        ledger.mint(batch)
        if offsets == ranges:  # what the batch left behind has been pending since ``since``
            (ledger.root / LAG_SINCE_FILE).unlink(missing_ok=True)
        return batch, f"{reason}: {lag}"


@dataclass(frozen=True)
class KafkaProgress:
    """Per partition the offset committed to the table, the log's last stable offset and the lag
    (offsets not committed yet); or why the brokers could not be asked."""

    partitions: list[dict[str, Any]]
    lag: int | None
    error: str | None = None

    def as_status(self) -> dict[str, Any]:
        return {"kafka_partitions": self.partitions, "kafka_lag": self.lag, "kafka_error": self.error}


def kafka_progress(lake: Lakehouse, stream: StreamSpec) -> KafkaProgress:
    """How far the stream's table is behind its topics, for ``lakehouse status`` and the UI."""
    committed = table_history(lake.table(stream.table_identifier)).kafka_offsets(stream.name)
    try:
        log = KafkaLog(stream).partitions()
    except LakehouseError as error:
        return KafkaProgress([], None, str(error))
    partitions = []
    for name, partition in log.items():
        reached = committed.get(name, partition.first)
        partitions.append(
            {
                "partition": name,
                "committed_offset": reached,
                "end_offset": partition.end,
                "lag": partition.end - reached,
            }
        )
    return KafkaProgress(
        partitions, sum(partition.end - committed.get(name, partition.first) for name, partition in log.items())
    )
