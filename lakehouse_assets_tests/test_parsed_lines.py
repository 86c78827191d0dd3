"""Which landing files Spark's JSON file reader may read: those whose every line it reads as the
typed parse does (blank, or an object with no zero byte among its first four bytes). Spark itself
checks the equivalence in ``test_hostile_input.py``; here the file test is held to its line rule."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lakehouse_assets.ingest.parsed_lines import read_alike

BOM = "\ufeff".encode()


def line_read_alike(line: bytes) -> bool:
    """The rule for one line (without its line break)."""
    start = line.removeprefix(BOM).lstrip(b" \t\r")
    return start[:1] in (b"{", b"") and b"\x00" not in line[:4]


@pytest.mark.parametrize(
    ("content", "alike"),
    [
        (b"", True),
        (b'{"a": 1}\n{"a": 2}\n', True),
        (b'{"a": 1}\r\n\r\n  \t\n' + BOM + b'{"a": 2}', True),
        (b'{"a": 1}\n[{"a": 2}, {"a": 3}]\n', False),
        (b'[{"a": 1}]\n{"a": 2}\n', False),
        (b'{"a": 1}\n42\n', False),
        (b'{"a": 1}\n' + '{"a": 2}'.encode("utf-16-le"), False),
        (b'{"a": "\x00"}\n', True),
        (b"{\x00}\n", False),
        (b'{"a": 1}\n\xff\xfe{}\n', False),
        (BOM + BOM + b"{}\n", False),
    ],
)
def test_a_file_is_read_alike_when_every_line_is(tmp_path, content, alike):
    (tmp_path / "f.ndjson").write_bytes(content)
    assert read_alike(str(tmp_path / "f.ndjson")) is alike


LINE = st.lists(
    st.sampled_from([b"{", b"}", b"[", b" ", b"\t", b"\r", b"\x00", b"\xff", BOM, b'"a": 1', b"\n"]), max_size=8
).map(b"".join)


@given(st.lists(LINE, max_size=6).map(b"".join))
def test_the_file_test_follows_the_line_rule(tmp_path_factory, content):
    file = tmp_path_factory.mktemp("lines") / "f.ndjson"
    file.write_bytes(content)
    assert read_alike(str(file)) == all(map(line_read_alike, content.split(b"\n")))
