import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse_assets.batches import landing
from lakehouse_assets.batches.landing import land_events, landing_dir, list_landing_files
from lakehouse_assets.batches.ledger import CommittedBatch
from lakehouse_assets.errors import IngestError
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


# Lines of every kind the two readers could disagree on: objects (with NaN, huge numbers, lone
# surrogates), other JSON values, blank and odd whitespace, arbitrary text and bytes.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30) | st.floats() | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=8,
)
_LINES = st.one_of(
    st.dictionaries(st.text(max_size=4), _JSON, max_size=3).map(lambda event: json.dumps(event).encode()),
    _JSON.map(lambda value: json.dumps(value).encode()),
    st.sampled_from([b"", b" ", b"\t\r", b"\x0b", b"\x1c", b"\xc2\xa0", b'{"a": 1}\r', b'\xef\xbb\xbf{"a": 1}']),
    st.text(max_size=12).map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.binary(max_size=12),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_LINES, max_size=5))
def test_the_quick_reading_of_lines_lands_exactly_what_the_line_by_line_rule_lands(lines):
    def outcome(read):
        try:
            return read(lines)
        except IngestError as error:
            return str(error)

    exact = outcome(lambda given: landing._validated_line_by_line(given, "input"))
    assert outcome(lambda given: landing.validated_lines(given, "input")) == exact
