"""The committer's bookkeeping without a JVM: the staging ledger, the commit plan, and what recovery
reads back from a real Iceberg table's snapshot summaries (written by PyIceberg's SQL catalog on
SQLite with the keys the committer stamps; no Spark)."""

import json
import os
import tempfile
import threading
from pathlib import Path
from unittest.mock import patch

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.batches.ledger import (
    COMMITTED_FILE,
    STAGED_FILE,
    BatchRecord,
    CommittedBatch,
    MintedBatch,
    StagedBatch,
    StreamLedger,
    exists_when_opened,
)
from lakehouse_assets.commit.committer import plan_commit
from lakehouse_assets.commit.recovery import committed_landing_files, committed_state, next_epoch
from lakehouse_assets.commit.summary_keys import CommitStamp, commit_summary
from lakehouse_assets.config.spec import parse_config
from lakehouse_assets.errors import BatchConflictError, SequenceGapError
from lakehouse_assets.faults import InjectedFault
from lakehouse_assets.ingest.pending_landing import pending_files
from lakehouse_assets.paths import LakehousePaths


def _minted(sequence: int, files: list[str] | None = None) -> MintedBatch:
    files = files or [f"landing-{sequence}.ndjson"]
    return MintedBatch("orders", sequence, "sales.orders", files, 10, 0.0, 0.0)


def _staged(sequence: int, attempt: str = "a") -> StagedBatch:
    return StagedBatch(sequence, attempt, rows=1, rejected=0, min_event_time=None, max_event_time=None, staged_at=0.0)


def _ledger_with(tmp_path, minted: list[int], staged: list[int]) -> StreamLedger:
    ledger = StreamLedger(tmp_path / "staging" / "orders")
    for sequence in minted:
        ledger.mint(_minted(sequence))
    for sequence in staged:
        ledger.record_staged(_staged(sequence))
    return ledger


def test_a_sequence_is_minted_once_and_the_first_recorded_attempt_wins(tmp_path):
    ledger = _ledger_with(tmp_path, [1], [])
    with pytest.raises(BatchConflictError, match="batch 1 was minted already"):
        ledger.mint(_minted(1, ["another.ndjson"]))
    (first, first_dir), (second, second_dir) = ledger.new_attempt(1), ledger.new_attempt(1)
    first_dir.mkdir()
    second_dir.mkdir()

    assert ledger.record_staged(_staged(1, first))
    assert not ledger.record_staged(_staged(1, second))
    ledger.remove_attempts(1, keep=first)

    assert ledger.batch(1).staged.attempt == first
    assert (first_dir.exists(), second_dir.exists()) == (True, False)
    assert ledger.claimed_files() == {"landing-1.ndjson"}


def test_a_mint_that_died_before_its_record_leaves_no_batch_and_its_sequence_is_minted_next(tmp_path):
    ledger = _ledger_with(tmp_path, [1], [])
    ledger.batch(1).directory.with_name(f"{2:010d}").mkdir()  # the directory, not yet batch.json

    assert [record.sequence for record in ledger.batches()] == [1]
    assert ledger.latest().sequence == ledger.highest_sequence() == 1
    ledger.mint(_minted(2))
    assert ledger.latest().sequence == 2


def test_the_plan_takes_staged_batches_in_order_and_waits_at_the_first_unstaged_one(tmp_path):
    ledger = _ledger_with(tmp_path, [1, 2, 3, 4], [1, 2, 3])

    plan = plan_commit(ledger, "orders", committed_sequence=1)

    assert [record.sequence for record in plan.ready] == [2, 3]
    assert plan.recovered == [1]  # in the table's ancestry, not yet recorded in the ledger
    assert plan.waiting_on == "batch 4 is minted but not staged yet"


def test_a_batch_missing_from_the_ledger_stops_the_plan_naming_it(tmp_path):
    ledger = _ledger_with(tmp_path, [1, 3], [1, 3])

    with pytest.raises(SequenceGapError, match="batch 2 is missing from the staging ledger but batch 3 exists"):
        plan_commit(ledger, "orders", committed_sequence=0)


def test_recovery_reads_the_committed_sequence_epoch_and_files_from_the_snapshot_summaries(tmp_path):
    ledger = _ledger_with(tmp_path, [1, 2, 3], [1, 2, 3])
    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("sales")
    table = catalog.create_table("sales.orders", pa.schema([("order_id", pa.int64())]))
    assert committed_state(table, "orders").sequence == 0 and next_epoch(table) == 1

    rows = pa.table({"order_id": pa.array([1], pa.int64())})
    first = commit_summary("orders", [ledger.batch(1)], 1, 1, CommitStamp(1, "run-a"))
    table.append(rows, snapshot_properties=first)
    later = commit_summary("orders", [ledger.batch(2), ledger.batch(3)], 1, 1, CommitStamp(2, "run-b"))
    table.append(rows, snapshot_properties=later)
    table = catalog.load_table("sales.orders")

    state = committed_state(table, "orders")
    assert (state.sequence, state.snapshot_id, state.epoch) == (3, table.current_snapshot().snapshot_id, 2)
    assert next_epoch(table) == 3
    assert committed_landing_files(table, "orders") == {"landing-1.ndjson", "landing-2.ndjson", "landing-3.ndjson"}
    assert committed_state(table, "customers").sequence == 0
    assert [record.sequence for record in plan_commit(ledger, "orders", state.sequence).ready] == []


BATCH_STATES = st.lists(
    st.tuples(st.sampled_from(["empty", "minted", "staged", "committed"]), st.booleans()), max_size=12
)


@settings(max_examples=60, deadline=None)
@given(
    states=BATCH_STATES,
    after=st.integers(0, 13),
    lacking=st.sampled_from([None, STAGED_FILE, COMMITTED_FILE]),
    with_attempts=st.booleans(),
)
def test_the_ledgers_narrow_reads_return_what_the_whole_read_filtered_alike_does(states, after, lacking, with_attempts):
    """A week of batches is read only where a caller needs it: each narrow read (after a sequence,
    lacking a record, holding an attempt) equals the whole read filtered in Python, in any mix of
    minted, staged, committed batches, attempts, the empty directory of a mint that died, and a
    directory whose name only Unicode calls a number."""
    with tempfile.TemporaryDirectory() as work:
        ledger = StreamLedger(Path(work) / "orders")
        (ledger.root / "\u0663").mkdir(parents=True)  # ARABIC-INDIC DIGIT THREE: not a sequence
        for sequence, (state, attempt) in enumerate(states, start=1):
            if state == "empty":
                (ledger.root / f"{sequence:010d}").mkdir()
                continue
            ledger.mint(_minted(sequence, [f"landing-{sequence}-{n}.ndjson" for n in range(2)]))
            if state != "minted":
                ledger.record_staged(_staged(sequence))
            if state == "committed":
                ledger.record_committed(sequence, CommittedBatch(sequence, sequence, 0.0))
            if attempt:
                ledger.new_attempt(sequence)[1].mkdir()
        whole = ledger.batches()

        def kept(record: BatchRecord) -> bool:
            has = {STAGED_FILE: record.staged is not None, COMMITTED_FILE: record.committed is not None}
            attempts = any(record.directory.glob("attempt-*"))
            return record.sequence > after and not (lacking and has[lacking]) and (attempts or not with_attempts)

        expected = [record for record in whole if kept(record)]
        assert ledger.batches(after=after, lacking=lacking, with_attempts=with_attempts) == expected
        minted = [sequence for sequence, (state, _) in enumerate(states, 1) if state != "empty"]
        assert [record.sequence for record in whole] == minted
        assert ledger.claimed_files() == {name for record in whole for name in record.minted.files}
        assert ledger.highest_sequence() == max((record.sequence for record in whole), default=0)


def test_a_stream_whose_table_names_every_landed_file_reads_no_batch_record(tmp_path):
    """An idle stream's sensor ticks ask the table first: with every landed file in its commits,
    no ``batch.json`` is read (here none could be: they are damaged); a new file, or one in a
    batch the table does not hold yet, sends it to the ledger as before."""
    paths = LakehousePaths(tmp_path, tmp_path)
    stream = parse_config({"streams": [{"name": "orders", "table_identifier": "sales.orders"}]}).stream("orders")
    ledger = StreamLedger(paths.staging("orders"))
    for sequence in (1, 2):
        [landed] = land_events(paths, stream, [json.dumps({"order_id": sequence})])
        ledger.mint(_minted(sequence, [landed.name]))
        ledger.record_staged(_staged(sequence))
    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("sales")
    table = catalog.create_table("sales.orders", pa.schema([("order_id", pa.int64())]))
    summary = commit_summary("orders", [ledger.batch(1), ledger.batch(2)], 1, 1, CommitStamp(1, "run-a"))
    table.append(pa.table({"order_id": pa.array([1], pa.int64())}), snapshot_properties=summary)
    table = catalog.load_table("sales.orders")
    records = {ledger.batch(sequence).directory / "batch.json": None for sequence in (1, 2)}
    for record in records:
        records[record] = record.read_text()
        record.write_text("{damaged")

    assert pending_files(paths, stream, ledger, table) == []

    for record, text in records.items():
        record.write_text(text)
    [in_a_batch] = land_events(paths, stream, [json.dumps({"order_id": 3})])
    ledger.mint(_minted(3, [in_a_batch.name]))
    [new] = land_events(paths, stream, [json.dumps({"order_id": 4})])
    assert [landed.name for landed in pending_files(paths, stream, ledger, table)] == [new.name]


def test_a_file_whose_batch_retention_removes_while_it_is_listed_is_not_pending(tmp_path):
    """Retention removes a batch's landing files, then its entry; a sensor that listed the file
    before and reads the ledger after finds neither, and does not take the file for a new one."""
    paths = LakehousePaths(tmp_path, tmp_path)
    stream = parse_config({"streams": [{"name": "orders", "table_identifier": "sales.orders"}]}).stream("orders")
    ledger = StreamLedger(paths.staging("orders"))
    [retained] = land_events(paths, stream, [json.dumps({"order_id": 1})])
    ledger.mint(_minted(1, [retained.name]))
    [new] = land_events(paths, stream, [json.dumps({"order_id": 2})])
    read_claimed = StreamLedger.claimed_files

    def retention_in_between(self: StreamLedger) -> set[str]:
        retained.unlink()
        self.remove_batch(1)
        return read_claimed(self)

    with patch.object(StreamLedger, "claimed_files", retention_in_between):
        assert [landed.name for landed in pending_files(paths, stream, ledger, None)] == [new.name]


def test_a_removal_cut_short_leaves_no_batch_behind_and_the_next_sweep_deletes_it(tmp_path, monkeypatch):
    ledger = _ledger_with(tmp_path, [1, 2], [1, 2])
    ledger.record_committed(1, CommittedBatch(1, 1, 0.0))
    monkeypatch.setenv(faults.FAIL_ENV, faults.LEDGER_DURING_REMOVAL)

    with pytest.raises(InjectedFault):
        ledger.remove_batch(1)

    assert [record.sequence for record in ledger.batches()] == [2]
    assert [record.sequence for record in ledger.batches(lacking=COMMITTED_FILE)] == [2]
    [left] = [path.name for path in ledger.root.iterdir() if path.name.startswith(".")]
    ledger.sweep_removed()
    assert sorted(path.name for path in ledger.root.iterdir()) == [f"{2:010d}"], left


def test_what_is_not_a_regular_file_is_never_pending_and_never_blocks_the_sensor(tmp_path):
    """A FIFO, a directory and a dangling link named like landing files are not landed files: they
    would be batched and fail their batch as lost, holding the stream back. Nor may they block the
    sensor (a FIFO's open waits for a writer unless made not to)."""
    paths = LakehousePaths(tmp_path, tmp_path)
    stream = parse_config({"streams": [{"name": "orders", "table_identifier": "sales.orders"}]}).stream("orders")
    [landed] = land_events(paths, stream, [json.dumps({"order_id": 1})])
    os.mkfifo(landed.with_name("pipe.ndjson"))
    landed.with_name("directory.ndjson").mkdir()
    landed.with_name("dangling.ndjson").symlink_to(tmp_path / "nowhere.ndjson")
    ledger = StreamLedger(paths.staging("orders"))
    found: list[str] = []
    asking = threading.Thread(
        target=lambda: found.extend(pending.name for pending in pending_files(paths, stream, ledger, None)), daemon=True
    )
    asking.start()
    asking.join(timeout=10)

    assert not asking.is_alive(), "pending_files blocked"
    assert found == [landed.name]
    assert exists_when_opened(landed.with_name("pipe.ndjson"))  # opened at once, no writer needed
