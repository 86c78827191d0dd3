"""The staging ledger a process keeps reading (``StreamLedger``) always says what its files say.

A process keeps the records it has read and reads a batch's files again only when they no longer
stat the same (``batches/ledger.py``). A state machine mints, stages, commits, resets, forgets and
removes batches, through the handle that keeps reading and through another process's handles
alike, ages the files as hours passing would (so kept records are used), and after every step
compares both handles' view with the files read afresh.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lakehouse_assets.batches.ledger import (
    SETTLED_NS,
    BatchRecord,
    CommittedBatch,
    MintedBatch,
    StagedBatch,
    StreamLedger,
)


def _read_afresh(ledger: StreamLedger) -> list[BatchRecord]:
    """Every batch of the ledger's directory, read from its files now, keeping nothing."""
    directories = sorted(path for path in ledger.root.iterdir() if path.name.isdigit())
    records = (StreamLedger._read_batch(directory) for directory in directories)
    return [record for record in records if record is not None]


class LedgerLife(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="ledger-")) / "orders"
        self.reader = StreamLedger(self.root)  # one long-lived handle, as a sensor's process keeps
        self.minted = 0

    def _writer(self, elsewhere: bool) -> StreamLedger:
        return StreamLedger(self.root) if elsewhere else self.reader

    @rule(files=st.integers(min_value=0, max_value=3))
    def mint(self, files: int) -> None:
        self.minted += 1
        names = [f"events-{self.minted}-{n}.jsonl" for n in range(files)]
        self.reader.mint(MintedBatch("orders", self.minted, "sales.orders", names, 10 * files, 1.0, 2.0))

    @precondition(lambda self: self.minted > 0)
    @rule(data=st.data(), rows=st.integers(min_value=0, max_value=10**6), elsewhere=st.booleans())
    def stage(self, data: st.DataObject, rows: int, elsewhere: bool) -> None:
        sequence = data.draw(st.integers(min_value=1, max_value=self.minted))
        if (self.root / f"{sequence:010d}" / "batch.json").exists():
            staged = StagedBatch(sequence, f"a{rows}", rows, 0, None, None, 3.0)
            self._writer(elsewhere).record_staged(staged)

    @precondition(lambda self: self.minted > 0)
    @rule(data=st.data(), snapshot=st.integers(min_value=1, max_value=9), elsewhere=st.booleans())
    def commit(self, data: st.DataObject, snapshot: int, elsewhere: bool) -> None:
        """Committed again with a snapshot id of the same size: the same file size every time."""
        sequence = data.draw(st.integers(min_value=1, max_value=self.minted))
        if (self.root / f"{sequence:010d}" / "batch.json").exists():
            self._writer(elsewhere).record_committed(sequence, CommittedBatch(snapshot, 1, 4.0))

    @precondition(lambda self: self.minted > 0)
    @rule(data=st.data(), elsewhere=st.booleans())
    def reset_or_forget(self, data: st.DataObject, elsewhere: bool) -> None:
        sequence = data.draw(st.integers(min_value=1, max_value=self.minted))
        ledger = self._writer(elsewhere)
        data.draw(st.sampled_from([ledger.reset_to_minted, ledger.forget_staged_data]))(sequence)

    @precondition(lambda self: self.minted > 0)
    @rule(data=st.data(), elsewhere=st.booleans())
    def remove(self, data: st.DataObject, elsewhere: bool) -> None:
        self._writer(elsewhere).remove_batch(data.draw(st.integers(min_value=1, max_value=self.minted)))

    @rule()
    def hours_pass(self) -> None:
        """Every record file looks written long ago, so the records read from them are kept."""
        written_long_ago = time.time_ns() - 10 * SETTLED_NS
        for path in self.root.rglob("*.json"):
            os.utime(path, ns=(written_long_ago, written_long_ago))

    @invariant()
    def every_handle_reads_what_the_files_hold(self) -> None:
        if not self.root.is_dir():
            return
        on_disk = _read_afresh(self.reader)
        assert self.reader.batches() == on_disk
        assert StreamLedger(self.root).batches() == on_disk
        for record in on_disk:
            assert self.reader.batch(record.sequence) == record

    def teardown(self) -> None:
        shutil.rmtree(self.root.parent, ignore_errors=True)


LedgerLife.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_a_ledger_read_again_and_again_says_what_its_files_say = LedgerLife.TestCase
