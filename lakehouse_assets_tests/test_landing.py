import pytest

from lakehouse_assets.errors import IngestError
from lakehouse_assets.ingest.batch_ledger import CommittedBatch
from lakehouse_assets.ingest.landing import land_events, landing_dir, list_landing_files
from lakehouse_assets.ingest.micro_batching import mint_next_batch, work_may_be_waiting
from lakehouse_assets_tests.conftest import order_event


def test_ingest_lands_immutable_ndjson_files(lake):
    stream = lake.stream("orders")
    first = land_events(lake.paths, stream, [order_event(1), order_event(2)])
    second = land_events(lake.paths, stream, [order_event(3) + "\n", "\n"])
    files = list_landing_files(landing_dir(lake.paths, stream))
    assert [f.name for f in files] == [first[0].name, second[0].name]
    assert first[0].read_text().splitlines() == [order_event(1), order_event(2)]
    assert second[0].read_text() == order_event(3) + "\n"


def test_bad_line_is_named_and_nothing_lands(lake):
    stream = lake.stream("orders")
    with pytest.raises(IngestError, match="input line 2: not valid JSON"):
        land_events(lake.paths, stream, [order_event(1), "{broken", order_event(3)])
    with pytest.raises(IngestError, match="line 1: expected a JSON object"):
        land_events(lake.paths, stream, ["[1, 2]"])
    assert list_landing_files(landing_dir(lake.paths, stream)) == []


def test_files_being_written_by_producers_are_not_listed(lake):
    directory = landing_dir(lake.paths, lake.stream("orders"))
    directory.mkdir(parents=True)
    (directory / ".partial.ndjson.tmp").write_text(order_event(1))
    (directory / "notes.txt").write_text("ignored")
    (directory / "producer-0001.ndjson").write_text(order_event(2) + "\n")
    assert [f.name for f in list_landing_files(directory)] == ["producer-0001.ndjson"]


def test_work_may_be_waiting_while_a_file_is_unbatched_or_a_batch_uncommitted(lake):
    stream = lake.stream("orders")
    assert not work_may_be_waiting(lake)

    land_events(lake.paths, stream, [order_event(1)])
    assert work_may_be_waiting(lake)

    batch, _ = mint_next_batch(lake, stream, drain=True)
    assert work_may_be_waiting(lake)

    lake.ledger(stream.name).record_committed(batch.sequence, CommittedBatch(1, batch.sequence, 0.0))
    assert not work_may_be_waiting(lake)
