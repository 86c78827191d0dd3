"""What a round's reads of a stream's staging ledger cost as it grows.

A stream's ledger keeps every committed batch for ``maintenance.landing_retention`` (a week by
default). This writes ``--batches`` committed batches (as a week of a stream cutting one a minute
leaves, records as the pipeline writes them) and two open ones, then
times, in CPU-seconds (median of ``--scans``), each read the landing sensor, the writer and the
committer make of it, side by side with a tenth of the batches, and against the baseline: the
whole read (every batch's three record files) that each of them made before. A round of one stream
makes the reads below as many times as ``PER_ROUND`` says (counted on the fault pipeline's rounds),
so the last lines compare a round's ledger reads both ways.

Then the pending landing files of an idle stream (every batch committed to a real Iceberg table,
PyIceberg's SQL catalog, one commit naming the landed files, which are kept): what a landing sensor
tick asks every few seconds, now (the table asked first) against reading every ``batch.json`` too.

    python bench/ledger_scan.py [--batches 10000] [--scans 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from lakehouse_assets.batches.landing import list_landing_files
from lakehouse_assets.batches.ledger import (
    COMMITTED_FILE,
    STAGED_FILE,
    CommittedBatch,
    MintedBatch,
    StagedBatch,
    StreamLedger,
)
from lakehouse_assets.commit.committer import plan_commit
from lakehouse_assets.commit.recovery import committed_landing_files
from lakehouse_assets.commit.summary_keys import CommitStamp, commit_summary
from lakehouse_assets.config.spec import parse_config
from lakehouse_assets.ingest.pending_landing import pending_files
from lakehouse_assets.paths import LakehousePaths

OPEN_BATCHES = 2
WHOLE = "whole read (every read before)"
# Each read, with how many times one stream's round makes it (a writer run and a committer run,
# with the landing sensor's and the commit sensor's ticks between them). The claimed files' six are
# an upper bound: the lag's two and an idle tick's are now answered by the table alone (below).
PER_ROUND = {
    "the landing sensor's unstaged batches": 2,
    "the commit plan": 3,
    "backpressure's open batches": 3,
    "the highest sequence": 3,
    "the claimed landing files": 6,
    "batches that hold staged Parquet": 1.5,
    "the lag's open batches": 2,
}
PER_ROUND_BEFORE = 20.5


def _write_ledger(root: Path, committed: int) -> StreamLedger:
    ledger = StreamLedger(root)
    for sequence in range(1, committed + OPEN_BATCHES + 1):
        files = [f"{1_800_000_000 + sequence}-{n:04d}-{os.urandom(4).hex()}.jsonl" for n in range(3)]
        ledger.mint(MintedBatch("clicks", sequence, "web.clicks", files, 3 * 65536, 1.8e9, 1.8e9))
        if sequence <= committed:
            attempt = os.urandom(8).hex()
            ledger.record_staged(StagedBatch(sequence, attempt, 1200, 3, "2026-12-07", "2026-12-07", 1.8e9))
            ledger.record_committed(sequence, CommittedBatch(4_000_000_000_000_000 + sequence, sequence, 1.8e9))
    return ledger


def _reads(ledger: StreamLedger, committed: int) -> dict[str, Callable[[], object]]:
    return {
        WHOLE: ledger.batches,
        "the landing sensor's unstaged batches": lambda: ledger.batches(lacking=STAGED_FILE),
        "the commit plan": lambda: plan_commit(ledger, "clicks", committed),
        "backpressure's open batches": lambda: ledger.batches(after=committed, lacking=COMMITTED_FILE),
        "the highest sequence": ledger.highest_sequence,
        "the claimed landing files": ledger.claimed_files,
        "the lag's open batches": lambda: ledger.batches(after=committed),
        "batches that hold staged Parquet": lambda: ledger.batches(with_attempts=True),
    }


def _cpu(action: Callable[[], object]) -> float:
    started = time.process_time()
    action()
    return time.process_time() - started


def _timed_reads(committed: int, scans: int) -> dict[str, float]:
    """CPU-seconds of each read of a ledger of ``committed`` batches (and the open ones), the median
    of ``scans`` in one process after a first read."""
    work = Path(tempfile.mkdtemp(prefix="ledger-scan-"))
    try:
        ledger = _write_ledger(work / "staging" / "clicks", committed)
        timings = {}
        for name, read in _reads(ledger, committed).items():
            read()
            timings[name] = statistics.median(_cpu(read) for _ in range(scans))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return timings


def _idle_pending_reads(committed: int, scans: int) -> tuple[float, float]:
    """CPU-seconds of an idle stream's pending files with ``committed`` batches: now, and with every
    ``batch.json`` read as well (the old order: the claimed files, then the table's)."""
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    work = Path(tempfile.mkdtemp(prefix="ledger-pending-"))
    try:
        paths = LakehousePaths(work, work)
        stream = parse_config({"streams": [{"name": "clicks", "table_identifier": "web.clicks"}]}).stream("clicks")
        ledger = _write_ledger(paths.staging("clicks"), committed)
        for sequence in range(committed + 1, committed + OPEN_BATCHES + 1):  # the open ones committed too
            ledger.record_staged(StagedBatch(sequence, "a", 1, 0, None, None, 1.8e9))
            ledger.record_committed(sequence, CommittedBatch(sequence, sequence, 1.8e9))
        records = ledger.batches()
        paths.landing("clicks").mkdir(parents=True)
        for record in records:
            for name in record.minted.files:
                (paths.landing("clicks") / name).write_bytes(b'{"id": 1}\n')
        catalog = SqlCatalog("lake", uri=f"sqlite:///{work}/catalog.db", warehouse=f"file://{work}/warehouse")
        catalog.create_namespace("web")
        table = catalog.create_table("web.clicks", pa.schema([("id", pa.int64())]))
        summary = commit_summary("clicks", records, 1, 1, CommitStamp(1, "bench"))
        table.append(pa.table({"id": pa.array([1], pa.int64())}), snapshot_properties=summary)
        table = catalog.load_table("web.clicks")

        def both_read() -> list[str]:
            claimed = ledger.claimed_files() | committed_landing_files(table, "clicks")
            return [landed.name for landed in list_landing_files(paths.landing("clicks")) if landed.name not in claimed]

        now = lambda: pending_files(paths, stream, ledger, table)  # noqa: E731
        assert now() == [] and both_read() == []
        now_cpu = statistics.median(_cpu(now) for _ in range(scans))
        return now_cpu, statistics.median(_cpu(both_read) for _ in range(scans))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--scans", type=int, default=5)
    arguments = parser.parse_args()
    small_count = max(1, arguments.batches // 10)
    small = _timed_reads(small_count, arguments.scans)
    large = _timed_reads(arguments.batches, arguments.scans)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"CPU-seconds of one read (median of {arguments.scans}), committed batches plus {OPEN_BATCHES} open:")
    print(f"  {'read':<40} {small_count:>8} {arguments.batches:>8}   against the whole read")
    for name in large:
        print(f"  {name:<40} {small[name]:8.4f} {large[name]:8.4f}   {large[name] / large[WHOLE]:.3f}x")
    for count, timings in ((small_count, small), (arguments.batches, large)):
        before = PER_ROUND_BEFORE * timings[WHOLE]
        after = sum(times * timings[name] for name, times in PER_ROUND.items())
        ratio = after / before
        print(f"  one stream's round at {count} batches: {before:.2f} CPU-s before, {after:.2f} now ({ratio:.2f}x)")
    print("CPU-seconds of an idle stream's pending landing files (a landing sensor tick asks):")
    for count in (small_count, arguments.batches):
        now, both = _idle_pending_reads(count, arguments.scans)
        print(f"  {count:>7} batches  the table first {now:.4f}  every batch.json too {both:.4f} ({now / both:.2f}x)")


if __name__ == "__main__":
    main()
