"""Landing files read by Spark's splittable reader keep each line's exact file and line number,
however a file is cut into splits, and when each file is read whole without the counting pass."""

from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse_assets.batches.staged_format import EVENT_COLUMN, LINE_COLUMN, SOURCE_FILE_COLUMN
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.ingest import landing_reader
from lakehouse_assets.ingest.landing_reader import read_landing_lines
from lakehouse_assets.lakehouse import Lakehouse

pytestmark = pytest.mark.spark

# Lines of a landing file: short and long events, blank lines, CRLF endings, non-ASCII text.
LINE = st.one_of(
    st.builds(lambda n: f'{{"id": {n}}}', st.integers(0, 10**6)),
    st.builds(lambda s: '{"note": "' + s + '"}', st.text(st.characters(codec="utf-8", exclude_characters='"\\\n\r'))),
    st.just(""),
    st.just("   "),
    st.builds(lambda n: f'{{"id": {n}, "pad": "{"x" * 300}"}}\r', st.integers(0, 99)),
)


def _session(home):
    from lakehouse_assets.config.spec import parse_config
    from lakehouse_assets.paths import LakehousePaths

    config = parse_config({"streams": [{"name": "s", "table_identifier": "a.b"}]})
    return lakehouse_session(Lakehouse(config, LakehousePaths(home, home)))


@pytest.fixture(scope="module")
def small_splits(tmp_path_factory):
    """A Spark session that cuts files into splits of 256 bytes, so each file has many."""
    home = tmp_path_factory.mktemp("lines")
    spark = _session(home)
    spark.conf.set("spark.sql.files.maxPartitionBytes", "256")
    spark.conf.set("spark.sql.files.openCostInBytes", "1")
    return spark, home


@pytest.fixture(scope="module")
def default_splits(tmp_path_factory):
    """A Spark session with Spark's own split size (128 MiB)."""
    home = tmp_path_factory.mktemp("whole")
    return _session(home), home


def _read_as_written(spark, home, files, newline_at_end):
    """Write ``files`` (lists of lines) as landing files, each ending with a line break where
    ``newline_at_end`` says (one flag for every file, or one per file), read them with
    ``read_landing_lines``, assert every non-blank line came back with its file's name and its line
    number; the frame."""
    endings = newline_at_end if isinstance(newline_at_end, list) else [newline_at_end] * len(files)
    directory = home / f"landing-{abs(hash((str(files), str(endings))))}"
    directory.mkdir(exist_ok=True)
    expected = []
    paths = []
    for index, (lines, ending) in enumerate(zip(files, endings, strict=True)):
        name = f"{index:03d}-events.ndjson"
        text = "\n".join(lines) + ("\n" if ending else "")
        (directory / name).write_bytes(text.encode("utf-8"))
        paths.append(str(directory / name))
        expected += [(name, number, line) for number, line in enumerate(lines, start=1) if line.strip(" \t\r")]

    frame = read_landing_lines(spark, paths, directory / "links")
    rows = frame.select(SOURCE_FILE_COLUMN, LINE_COLUMN, EVENT_COLUMN).collect()

    assert sorted(tuple(row) for row in rows) == sorted(expected)
    return frame


# Fewer, larger examples: each read's Spark jobs cost far more than its lines, so six examples of up
# to 12 files (each with its own last line break) read about as many files as 15 of up to three did
# (hypothesis's first example is its simplest, one file of one line, either way), in 6 reads.
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(st.tuples(st.lists(LINE, min_size=1, max_size=60), st.booleans()), min_size=1, max_size=12))
def test_every_non_blank_line_keeps_its_file_and_line_number(small_splits, files):
    spark, home = small_splits
    newline_at_end = [ending for _, ending in files]
    files = [lines for lines, _ in files]
    # The counting pass, whatever the files' sizes (small files would be read whole).
    with patch.object(landing_reader, "_whole_file_reader", lambda spark, sizes: None):
        frame = _read_as_written(spark, home, files, newline_at_end)

    assert frame.rdd.getNumPartitions() > 1 or sum(len("\n".join(lines)) for lines in files) < 256


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.lists(st.lists(LINE, min_size=1, max_size=60), min_size=2, max_size=6).filter(
        lambda files: sum(1 for lines in files if "".join(lines)) >= 2
    ),
    newline_at_end=st.booleans(),
)
def test_files_read_whole_number_lines_without_the_counting_pass(default_splits, files, newline_at_end):
    spark, home = default_splits
    frame = _read_as_written(spark, home, files, newline_at_end)

    # One partition per file that is not empty (a number off by one fails the rows' comparison).
    non_empty = sum(1 for lines in files if "\n".join(lines) or newline_at_end)
    assert frame.rdd.getNumPartitions() == non_empty
