"""When to cut the next batch of a stream, and minting it in the staging ledger.

The trigger is the streaming-writes article's dual trigger: cut a batch when the pending bytes
reach ``flush.max_bytes`` or when the oldest pending event is older than ``flush.max_age``.
A batch takes pending files in name order up to ``max_bytes`` (at least one file). No batch is cut
while uncommitted batches hold ``max_uncommitted_bytes`` (backpressure), so a slow committer bounds
the staged data, never the landing zone.

A landing file is pending when no minted batch in the staging ledger holds it and no commit in the
table's history names it (``lakehouse.landing-files``), so a lost ledger never batches a committed
file again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from lakehouse_assets.batches.landing import LandingFile, landing_dir, list_landing_files
from lakehouse_assets.batches.ledger import COMMITTED_FILE, MintedBatch, StreamLedger
from lakehouse_assets.commit.recovery import AUDIT_BRANCH, committed_state
from lakehouse_assets.config.spec import StreamSpec
from lakehouse_assets.ingest.kafka_batching import mint_next_kafka_batch
from lakehouse_assets.ingest.pending_landing import pending_files
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.locks import exclusive_lock, stream_lock_file

NO_PENDING_EVENTS = "no pending events"


@dataclass(frozen=True)
class FlushDecision:
    """Files to cut into a batch now (empty when waiting), and why."""

    files: list[LandingFile]
    reason: str


def decide_flush(pending: list[LandingFile], stream: StreamSpec, now: float, drain: bool = False) -> FlushDecision:
    """Apply the dual trigger to the pending files; ``drain`` cuts whatever is pending."""
    if not pending:
        return FlushDecision([], NO_PENDING_EVENTS)
    pending_bytes = sum(landed.size for landed in pending)
    oldest_age = now - min(landed.landed_at for landed in pending)
    flush = stream.flush
    if pending_bytes >= flush.max_bytes:
        reason = f"{pending_bytes} bytes pending >= flush.max_bytes {flush.max_bytes}"
    elif oldest_age >= flush.max_age:
        reason = f"oldest pending event is {oldest_age:.1f}s old >= flush.max_age {flush.max_age:g}s"
    elif drain:
        reason = "draining every pending event"
    else:
        return FlushDecision(
            [],
            f"waiting: {pending_bytes} bytes in {len(pending)} files pending (< flush.max_bytes "
            f"{flush.max_bytes}); oldest pending event is {oldest_age:.1f}s old "
            f"(< flush.max_age {flush.max_age:g}s)",
        )
    chosen: list[LandingFile] = []
    total = 0
    for landed in pending:
        if chosen and total + landed.size > flush.max_bytes:
            break
        chosen.append(landed)
        total += landed.size
    return FlushDecision(chosen, reason)


def backpressure(ledger: StreamLedger, stream: StreamSpec, committed_sequence: int) -> str | None:
    """Why no batch may be cut now, or None: uncommitted batches hold ``max_uncommitted_bytes``."""
    uncommitted = [r for r in ledger.batches(after=committed_sequence, lacking=COMMITTED_FILE) if r.committed is None]
    held = sum(record.minted.bytes for record in uncommitted)
    if held < stream.max_uncommitted_bytes:
        return None
    return (
        f"backpressure: {held} bytes in {len(uncommitted)} batches are minted or staged but not committed "
        f"(>= max_uncommitted_bytes {stream.max_uncommitted_bytes}); landing keeps accepting events"
    )


def work_may_be_waiting(lake: Lakehouse) -> bool:
    """A cheap guess, from the landing zones and ledgers alone (no table is read), that a run will
    need Spark: some stream has a landed file no batch claims, or a batch not committed yet."""
    for stream in lake.config.streams:
        ledger = lake.ledger(stream.name)
        # The claimed files first: a batch minted in between is then an uncommitted batch.
        claimed = ledger.claimed_files()
        if any(record.committed is None for record in ledger.batches(lacking=COMMITTED_FILE)):
            return True
        if any(landed.name not in claimed for landed in list_landing_files(landing_dir(lake.paths, stream))):
            return True
    return False


def mint_next_batch(
    lake: Lakehouse,
    stream: StreamSpec,
    now: float | None = None,
    drain: bool = False,
) -> tuple[MintedBatch | None, str]:
    """Cut and record the next batch if the trigger fires; returns it (or None) and the reason.

    Holds the stream's minting lock, so two sensors can never put one file in two batches. The
    sequence continues after both the ledger and the table's ancestry, and files the ancestry
    names are never batched again, so a wiped ledger neither reuses a committed sequence nor
    appends a committed file twice. A Kafka stream cuts offset ranges instead (``kafka_batching``).
    """
    if stream.kafka_source:
        return mint_next_kafka_batch(lake, stream, now, drain)
    ledger = lake.ledger(stream.name)
    with exclusive_lock(stream_lock_file(lake.paths.locks, stream.name)):
        now = time.time() if now is None else now
        # A router commits only its unroutable events, to its dead-letter table.
        progress = stream.router_dead_letter_identifier if stream.is_router else stream.table_identifier
        table = lake.table(progress)
        # Batches on an audit branch are not published: they still count against backpressure.
        committed = committed_state(table, stream.name).sequence
        on_any_branch = committed_state(table, stream.name, AUDIT_BRANCH).sequence if stream.publish == "audit" else 0
        held_back = backpressure(ledger, stream, committed)
        if held_back:
            return None, held_back
        # The highest sequence is read before the claimed files: a host sharing the staging ledger
        # (whose lock is not this one) that mints in between makes this mint's sequence taken
        # (BatchConflictError), never leaves its files unclaimed under a new sequence.
        highest = ledger.highest_sequence()
        decision = decide_flush(pending_files(lake.paths, stream, ledger, table), stream, now, drain)
        if not decision.files:
            return None, decision.reason
        sequence = max(highest, committed, on_any_branch) + 1
        batch = MintedBatch(
            stream=stream.name,
            sequence=sequence,
            table=stream.table_identifier,
            files=[landed.name for landed in decision.files],
            bytes=sum(landed.size for landed in decision.files),
            oldest_landed_at=min(landed.landed_at for landed in decision.files),
            minted_at=now,
        )
        ledger.mint(batch)
        return batch, decision.reason
