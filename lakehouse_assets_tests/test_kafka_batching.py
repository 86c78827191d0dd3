"""How a Kafka batch is cut from the partitions' lag: properties over any lag and limit (no broker)."""

from hypothesis import given
from hypothesis import strategies as st

from lakehouse_assets.ingest.kafka_batching import _limited, describe_lag, partition_lag
from lakehouse_assets.source.kafka_log import PartitionLog, lost_offsets

positions = st.dictionaries(st.sampled_from([f"t/{p}" for p in range(8)]), st.integers(0, 10_000), max_size=8)


@given(
    st.dictionaries(
        st.sampled_from([f"t/{p}" for p in range(8)]),
        st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 50_000),
)
def test_a_cut_batch_starts_where_the_last_ended_and_leaves_no_lagging_partition_behind(lags, max_records):
    ranges = {name: [start, start + lag] for name, (start, lag) in lags.items()}
    cut = _limited(ranges, max_records)
    assert cut.keys() == ranges.keys()
    pending = sum(end - start for start, end in ranges.values())
    for name, (start, end) in cut.items():
        assert start == ranges[name][0] and start <= end <= ranges[name][1]
        if ranges[name][1] > start:
            assert end > start  # every lagging partition advances
    taken = sum(end - start for start, end in cut.values())
    assert taken == pending if pending <= max_records else taken <= max_records + len(ranges)


@given(positions, st.dictionaries(st.sampled_from([f"t/{p}" for p in range(8)]), st.integers(0, 10_000), min_size=1))
def test_new_partitions_start_at_their_first_offset_and_known_ones_where_the_stream_is(known, firsts):
    log = {name: PartitionLog(first, first + 100) for name, first in firsts.items()}
    known = {name: min(offset, log[name].end) if name in log else offset for name, offset in known.items()}
    ranges = partition_lag(known, log)
    assert ranges.keys() == log.keys()
    for name, (start, end) in ranges.items():
        assert start == known.get(name, log[name].first)
        assert end == log[name].end
    lagging = [name for name, (start, end) in ranges.items() if end > start]
    described = describe_lag({}, ranges, limit=None)
    assert all(f"{name} committed 0 lag {ranges[name][1] - ranges[name][0]}" in described for name in lagging)


def test_offsets_deleted_before_they_were_read_are_named_and_only_those():
    log = {"t/0": PartitionLog(25, 40), "t/1": PartitionLog(0, 10), "t/2": PartitionLog(50, 60)}
    ranges = {"t/0": [10, 30], "t/1": [5, 10], "t/2": [20, 30]}
    assert lost_offsets(ranges, log) == {"t/0": [10, 25], "t/2": [20, 30]}
