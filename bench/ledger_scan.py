"""What reading a stream's whole staging ledger costs as it grows, read afresh against read by a
process that keeps the records it has read (``batches/ledger.py``).

A stream's ledger keeps every committed batch for ``maintenance.landing_retention`` (a week by
default), and the landing sensor, the writer and the committer read it whole several times a
round, in the sensor daemon's long-lived process as in each run's. This writes ``--batches``
committed batches (as a week of a stream cutting one a minute leaves, records as the pipeline
writes them), dates them an hour back, and times, in CPU-seconds of this process:

- afresh: every batch's three record files opened and parsed (what every scan did before);
- first: a process's first scan (``StreamLedger.batches``), which reads them and keeps them;
- again: each later scan, which stats them and reads only what changed.

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


def _cpu(action) -> float:
    started = time.process_time()
    action()
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--scans", type=int, default=5)
    arguments = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ledger-scan-"))
    try:
        root = work / "staging" / "clicks"
        _write_ledger(root, arguments.batches)
        directories = sorted(path for path in root.iterdir() if path.name.isdigit())
        afresh = [_cpu(lambda: [StreamLedger._read_batch(d) for d in directories]) for _ in range(arguments.scans)]
        ledger = StreamLedger(root)
        first = _cpu(ledger.batches)
        again = [_cpu(ledger.batches) for _ in range(arguments.scans)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    baseline = statistics.median(afresh)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"{arguments.batches} committed batches, CPU-seconds per whole-ledger scan (median of {arguments.scans}):")
    print(f"  afresh (the baseline)  {baseline:.3f}")
    print(f"  first scan, kept       {first:.3f}  ({first / baseline:.2f}x)")
    print(f"  later scans            {statistics.median(again):.3f}  ({statistics.median(again) / baseline:.2f}x)")


if __name__ == "__main__":
    main()
