"""The row delta's guard against stale changes compares source positions in DuckDB exactly as the
MERGE's guard compares them in Spark, NULL fields included (Spark orders a NULL field first)."""

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse_assets.commit.row_deltas import ordered_as_spark
from lakehouse_assets.config.spec import SOURCE_POSITION_COLUMN
from lakehouse_assets.engine.spark import lakehouse_session

pytestmark = pytest.mark.spark

small = st.one_of(st.none(), st.integers(0, 3))
positions = st.tuples(small, st.one_of(st.none(), st.sampled_from(["a", "b"])), small, small)


def _struct(position: tuple) -> str:
    lsn, file, pos, row = (("NULL" if v is None else repr(v)) for v in position)
    return (
        f"named_struct('lsn', CAST({lsn} AS DECIMAL(38,0)), 'file', CAST({file} AS STRING), "
        f"'pos', CAST({pos} AS DECIMAL(38,0)), 'row', CAST({row} AS BIGINT))"
    )


def _duck_struct(position: tuple) -> str:
    lsn, file, pos, row = (("NULL" if v is None else repr(v)) for v in position)
    return (
        f"({{'lsn': CAST({lsn} AS DECIMAL(38,0)), 'file': CAST({file} AS VARCHAR), "
        f"'pos': CAST({pos} AS DECIMAL(38,0)), 'row': CAST({row} AS BIGINT)}})"
    )


# One Spark query and one DuckDB query per example, each comparing up to 40 pairs.
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=st.lists(st.tuples(positions, positions), min_size=1, max_size=40))
def test_source_positions_compare_in_duckdb_as_in_spark(lake, pairs):
    spark = lakehouse_session(lake)
    spark_answers = spark.sql("SELECT " + ", ".join(f"{_struct(a)} >= {_struct(b)}" for a, b in pairs)).collect()[0]
    duck = duckdb.connect()
    duck_answers = duck.execute(
        "SELECT "
        + ", ".join(
            f"{ordered_as_spark(_duck_struct(a), SOURCE_POSITION_COLUMN)} >= "
            f"{ordered_as_spark(_duck_struct(b), SOURCE_POSITION_COLUMN)}"
            for a, b in pairs
        )
    ).fetchone()
    assert list(spark_answers) == list(duck_answers), pairs
