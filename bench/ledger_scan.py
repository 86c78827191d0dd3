"""What reading a stream's whole staging ledger costs as it grows.

A stream's ledger keeps every committed batch for ``maintenance.landing_retention`` (a week by
default; a router's entries for good), and the landing sensor, the writer and the committer read it
whole (``StreamLedger.batches``) about twenty times a round, in the sensor daemon's long-lived
process as in each run's. This writes ``--batches`` committed batches (as a week of a stream
cutting one a minute leaves, records as the pipeline writes them), dates them an hour back, and
times one whole read in CPU-seconds: a process's first, and the later ones in the same process,
side by side with a tenth of the batches. A ledger that kept what it read would show the later
reads below the first; today each read opens and parses every batch's three record files.

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

from lakehouse_assets.batches.ledger import CommittedBatch, MintedBatch, StagedBatch, StreamLedger


def _write_ledger(root: Path, batches: int) -> None:
    ledger = StreamLedger(root)
    for sequence in range(1, batches + 1):
        files = [f"{1_800_000_000 + sequence}-{n:04d}-{os.urandom(4).hex()}.jsonl" for n in range(3)]
        ledger.mint(MintedBatch("clicks", sequence, "web.clicks", files, 3 * 65536, 1.8e9, 1.8e9))
        ledger.record_staged(StagedBatch(sequence, os.urandom(8).hex(), 1200, 3, "2026-12-07", "2026-12-07", 1.8e9))
        ledger.record_committed(sequence, CommittedBatch(4_000_000_000_000_000 + sequence, sequence, 1.8e9))
    an_hour_ago = time.time_ns() - 3600 * 10**9
    for path in root.rglob("*.json"):
        os.utime(path, ns=(an_hour_ago, an_hour_ago))


def _cpu(action: Callable[[], object]) -> float:
    started = time.process_time()
    action()
    return time.process_time() - started


def _whole_reads(batches: int, scans: int) -> tuple[float, float]:
    """CPU-seconds of a process's first whole read of a ledger of ``batches``, and the median of the
    ``scans`` after it."""
    work = Path(tempfile.mkdtemp(prefix="ledger-scan-"))
    try:
        root = work / "staging" / "clicks"
        _write_ledger(root, batches)
        ledger = StreamLedger(root)
        first = _cpu(ledger.batches)
        later = statistics.median(_cpu(ledger.batches) for _ in range(scans))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return first, later


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--scans", type=int, default=5)
    arguments = parser.parse_args()
    small = max(1, arguments.batches // 10)
    small_first, small_later = _whole_reads(small, arguments.scans)
    first, later = _whole_reads(arguments.batches, arguments.scans)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"CPU-seconds of one whole read of a ledger of committed batches (later: median of {arguments.scans}):")
    print(f"  {small:>7} batches  first {small_first:.3f}  later {small_later:.3f} ({small_later / small_first:.2f}x)")
    print(f"  {arguments.batches:>7} batches  first {first:.3f}  later {later:.3f} ({later / first:.2f}x)")
    growth = arguments.batches / small
    print(f"  {arguments.batches} against {small}: {later / small_later:.1f}x the CPU for {growth:.0f}x the batches")


if __name__ == "__main__":
    main()
