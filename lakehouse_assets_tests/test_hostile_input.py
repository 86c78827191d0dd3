"""Nothing a producer sends stalls a stream, duplicates a row or loses one: every line becomes a row
or a dead letter with a reason, and the pipeline goes on (issue: hostile input is normal input)."""

import json
import tempfile
from collections import Counter
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from lakehouse_assets.batches.landing import land_events, landing_dir
from lakehouse_assets.batches.staged_format import LINE_COLUMN, REASON_COLUMN, SOURCE_FILE_COLUMN
from lakehouse_assets.commit.tables import ensure_table
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.ingest import conversion
from lakehouse_assets.ingest.landing_reader import read_landing_lines
from lakehouse_assets.ingest.micro_batching import mint_next_batch
from lakehouse_assets.ingest.parsed_lines import read_parsed_events
from lakehouse_assets.ingest.staging import stage_batch
from lakehouse_assets.ingest.table_commits import commit_table
from lakehouse_assets.jvm.column_cache import cached_columns
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.runner import run_pipeline_until_idle, run_until_idle
from lakehouse_assets_tests.conftest import ORDERS_STREAM, fail_python_workers, generate_code, order_event, write_config
from lakehouse_assets_tests.test_parsed_lines import line_read_alike
from lakehouse_assets_tests.test_pipeline import _duckdb_rows

pytestmark = pytest.mark.spark

SPARK_FAILURE = "Spark could not convert this event"


def _dead_letters(lake, identifier="sales.orders_dead_letters"):
    return _duckdb_rows(lake, identifier, "source_file, source_line, reason, event")


def test_an_epoch_in_nanoseconds_does_not_stall_the_stream(lake, instance):
    stream = lake.stream("orders")
    land_events(
        lake.paths, stream, [order_event(i) for i in range(1, 101)] + [order_event(101, ts=1764064800000000000)]
    )
    first = run_until_idle(build_definitions(lake.config), instance, log=lambda _: None)
    land_events(lake.paths, stream, [order_event(i) for i in range(102, 111)])
    later = run_until_idle(build_definitions(lake.config), instance, log=lambda _: None)

    assert first.failed == [] and later.failed == []
    rows = _duckdb_rows(lake, "sales.orders", "order_id, ts IS NULL")
    # ts is optional: a value that is no instant Spark can hold is NULL, as any uncoercible value.
    assert rows == [(i, i == 101) for i in range(1, 111)]


def test_nan_and_infinity_are_doubles_whichever_parse_reads_the_event(lake, instance):
    # Orders 2, 4 and 6 have their id as text, so their events are parsed as text, where the bare
    # tokens come back quoted; orders 5 and 6 send the values as strings.
    events = [
        '{"order_id": 1, "amount": Infinity}',
        '{"order_id": "2", "amount": Infinity}',
        '{"order_id": 3, "amount": NaN}',
        '{"order_id": "4", "amount": -Infinity}',
        '{"order_id": 5, "amount": "-Infinity"}',
        '{"order_id": "6", "amount": "NaN"}',
    ]
    land_events(lake.paths, lake.stream("orders"), events)

    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []
    rows = _duckdb_rows(lake, "sales.orders", "order_id, CAST(amount AS VARCHAR)")
    assert rows == [(1, "inf"), (2, "inf"), (3, "nan"), (4, "-inf"), (5, "-inf"), (6, "nan")]


def test_instants_before_1900_are_rows_and_dead_letters_not_failed_jobs(
    lakehouse_home, tmp_path, monkeypatch, instance
):
    # Spark's Parquet writer refuses dates before 1582 and timestamps before 1900 by default: a
    # rejected event (staged as Parquet) or a change stream's row (all staged as Parquet) with one
    # used to fail the writer run. Found by the property test below.
    from lakehouse_assets_tests.test_changes import customers_stream

    write_config(tmp_path, {"streams": [ORDERS_STREAM, customers_stream("2", "json")]}, monkeypatch)
    lake = Lakehouse.from_env()
    land_events(
        lake.paths,
        lake.stream("orders"),
        [order_event(1, ts="0001-01-01T00:00:00Z"), json.dumps({"amount": 1.0, "ts": "1000-06-01T00:00:00Z"})],
    )
    land_events(lake.paths, lake.stream("customers"), [json.dumps({"op": "c", "id": 7, "ts": "1200-01-01T12:00:00Z"})])

    report = run_pipeline_until_idle(instance, log=lambda _: None)

    assert report.failed == []
    assert [(i, str(ts)) for i, ts in _duckdb_rows(lake, "sales.orders", "order_id, ts")] == [
        (1, "0001-01-01 00:00:00+00:00")
    ]
    assert [reason for _, _, reason, _ in _dead_letters(lake)] == ["missing required field 'order_id'"]
    assert [(i, str(ts)) for i, ts in _duckdb_rows(lake, "crm.customers", "id, ts")] == [
        (7, "1200-01-01 12:00:00+00:00")
    ]


def test_an_event_spark_fails_on_is_isolated_and_dead_lettered(tmp_path, monkeypatch, lakehouse_home, instance):
    # A condition that fails the Spark job on some rows (what any conversion bug would do).
    failing = "CASE WHEN amount = 13.0 THEN raise_error('amount 13 is cursed') ELSE true END"
    stream = {**ORDERS_STREAM, "expectations": [{"name": "cursed", "condition": failing, "on_failure": "dead_letter"}]}
    write_config(tmp_path, {"streams": [stream]}, monkeypatch)
    lake = Lakehouse.from_env()
    events = [order_event(i) for i in range(1, 51)] + [order_event(51, amount=13.0), order_event(52, amount=13.0)]
    [landed] = land_events(lake.paths, lake.stream("orders"), events)
    fail_python_workers(lakehouse_session(lake), monkeypatch, tmp_path / "no-python")

    report = run_until_idle(build_definitions(lake.config), instance, log=lambda _: None)

    assert report.failed == []
    assert [row[0] for row in _duckdb_rows(lake, "sales.orders", "order_id")] == list(range(1, 51))
    dead = _dead_letters(lake)
    assert [(file, line) for file, line, _, _ in dead] == [(landed.name, 51), (landed.name, 52)]
    assert all(reason.startswith(SPARK_FAILURE) and "amount 13 is cursed" in reason for _, _, reason, _ in dead)


def test_landing_file_names_are_names_not_patterns(lake, instance):
    directory = landing_dir(lake.paths, lake.stream("orders"))
    directory.mkdir(parents=True)
    names = ["a1", "b1", "a?", "a[1]", "b{1,2}", "c*", "d e%20", "f:g", "h\\i", "ünï", "j'k\"", "tab\tname"]
    expected, order_id = [], 0
    for name in names:
        lines = []
        for _ in range(3):
            order_id += 1
            lines.append(order_event(order_id))
            expected.append((f"{name}.ndjson", order_id))
        (directory / f"{name}.ndjson").write_text("\n".join(lines) + "\n")

    report = run_until_idle(build_definitions(lake.config), instance, log=lambda _: None)
    land_events(lake.paths, lake.stream("orders"), [order_event(order_id + 1)])
    later = run_until_idle(build_definitions(lake.config), instance, log=lambda _: None)

    assert report.failed == [] and later.failed == []
    assert [row[0] for row in _duckdb_rows(lake, "sales.orders", "order_id")] == list(range(1, order_id + 2))


def test_a_routed_name_with_a_line_break_is_a_dead_letter_and_the_rest_is_routed(lakehouse_home, tmp_path, monkeypatch):
    router = {"name": "app", "table_identifier": "${/db}.${/t}", "auto_create": True, "commit_interval": "0s"}
    write_config(tmp_path, {"streams": [router]}, monkeypatch)
    lake = Lakehouse.from_env()
    hostile = ["orders\n", "orders\r", "a/b", "..", "", "x" * 200, "UPPER", "white space", "o\u2028"]
    events = [{"db": "shop", "t": "orders", "n": n} for n in range(5)] + [{"db": "shop", "t": t} for t in hostile]
    land_events(lake.paths, lake.stream("app"), [json.dumps(event) for event in events])

    from lakehouse_assets.runner import dagster_instance

    with dagster_instance(lake.paths) as instance:
        report = run_pipeline_until_idle(instance, log=lambda _: None)
        land_events(lake.paths, lake.stream("app"), [json.dumps({"db": "shop", "t": "orders", "n": 5})])
        later = run_pipeline_until_idle(instance, log=lambda _: None)

    assert report.failed == [] and later.failed == []
    lake = Lakehouse.from_env()
    assert sorted(stream.name for stream in lake.config.streams) == ["app", "app__shop__orders", "app__shop__upper"]
    assert _duckdb_rows(lake, "shop.orders", "n") == [(n,) for n in range(6)]
    dead = _dead_letters(lake, "lakehouse.app_dead_letters")
    assert sorted(json.loads(event)["t"] for *_, event in dead) == sorted(set(hostile) - {"UPPER"})
    assert all("table_identifier ${/db}.${/t}" in reason for _, _, reason, _ in dead)


def test_invalid_utf8_is_replaced_wherever_a_line_is_written(lakehouse_home, tmp_path, monkeypatch):
    # A line keeps its bytes as landed through the conversion; what writes its text (a route file,
    # a dead letter) writes valid UTF-8, U+FFFD for an invalid byte, as every JSON parse reads it.
    router = {"name": "app", "table_identifier": "${/db}.${/t}", "auto_create": True, "commit_interval": "0s"}
    write_config(tmp_path, {"streams": [ORDERS_STREAM, router]}, monkeypatch)
    lake = Lakehouse.from_env()
    landed = {
        "orders": [order_event(1).encode(), b'{"amount": 1.5, "note": "caf\xe9"}'],
        "app": [b'{"db": "shop", "t": "notes", "n": 1, "text": "caf\xe9"}', b'{"db": "shop", "t": "\xff\xfe"}'],
    }
    for stream, lines in landed.items():
        directory = landing_dir(lake.paths, lake.stream(stream))
        directory.mkdir(parents=True)
        (directory / "bytes.ndjson").write_bytes(b"\n".join(lines) + b"\n")

    from lakehouse_assets.runner import dagster_instance

    with dagster_instance(lake.paths) as instance:
        assert run_pipeline_until_idle(instance, log=lambda _: None).failed == []
    lake = Lakehouse.from_env()
    assert [(i,) for i, *_ in _duckdb_rows(lake, "sales.orders", "order_id")] == [(1,)]
    assert [event for *_, event in _dead_letters(lake)] == ['{"amount": 1.5, "note": "caf\ufffd"}']
    assert _duckdb_rows(lake, "shop.notes", "n, text") == [(1, "caf\ufffd")]
    [(_, line, reason, event)] = _dead_letters(lake, "lakehouse.app_dead_letters")
    assert (line, event) == (2, '{"db": "shop", "t": "\ufffd\ufffd"}') and "is not namespace.table" in reason


# Hostile values for every declared type: JSON texts, numbers out of every range, epochs in
# s/ms/us/ns, NaN and Infinity literals, wrong shapes, deep nesting and long strings.
SPECIAL_VALUES = [
    "0",
    "-1",
    "1.5",
    "-0.0",
    "1e308",
    "-1e309",
    "NaN",
    "Infinity",
    "-Infinity",
    "true",
    "null",
    '""',
    "[]",
    "{}",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "123456789012345678901234567890",
    "1764064800",
    "1764064800000",
    "1764064800000000",
    "1764064800000000000",
    "-62135596800001",
    "2932897",
    '"2026-11-26T10:00:00Z"',
    '"2026-11-26"',
    '"+99999-01-01T00:00:00Z"',
    '"0001-01-01"',
    '"not a date"',
    '"\\u0000"',
    '"\\n"',
    '"AAAA"',
    '"AAECAw=="',
    '"00000000-0000-0000-0000-000000000000"',
    '"00000000-0000-0000-0000-000000000000\\n"',
    '{"a": 1, "a": "x"}',
    '{"1": 1, "01": 2, "x": 3}',
    "[" * 1200 + "]" * 1200,
    '"' + "x" * 100_000 + '"',
    '{"a": {"b": [1, {"c": null}]}}',
]
JSON_TEXT = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-(2**80), 2**80), st.floats(allow_nan=False), st.text(max_size=20)
    ).map(json.dumps),
    lambda children: st.one_of(
        st.lists(children, max_size=3).map(lambda items: "[" + ",".join(items) + "]"),
        st.lists(st.tuples(st.sampled_from(["a", "b", "c", "1", "x y"]), children), max_size=3).map(
            lambda members: "{" + ",".join(f"{json.dumps(k)}: {v}" for k, v in members) + "}"
        ),
    ),
    max_leaves=8,
)
VALUE = st.one_of(st.sampled_from(SPECIAL_VALUES), JSON_TEXT)
COLUMNS = {
    "l": "long",
    "i": "int",
    "d": "double",
    "f": "float",
    "m": "decimal(9,2)",
    "b": "boolean",
    "s": "string",
    "t": "timestamp",
    "tz": "timestamptz",
    "dt": "date",
    "bin": "binary",
    "u": "uuid",
    "fx": "fixed[4]",
    "st": "struct<a: long, b: timestamptz, c: list<date>>",
    "ls": "list<long>",
    "ms": "map<string, date>",
    "ml": "map<long, string>",
}
HOSTILE_STREAM = {
    "name": "hostile",
    "table_identifier": "h.events",
    "auto_create": True,
    "schema": {
        "columns": [{"name": "id", "type": "long", "required": True}]
        + [{"name": name, "type": kind} for name, kind in COLUMNS.items()]
    },
    "commit_interval": "0s",
}


# Wrappings of an event Spark's JSON file reader reads as the typed parse does, and the others
# (a batch with one of them is read from its text).
READ_ALIKE = ["plain"] * 6 + ["bom", "crlf", "nul", "utf8", "truncated"]
READ_OTHERWISE = ["scalar", "array", "utf16"]


@st.composite
def hostile_line(draw, event_id: int, wrappings: list[str]) -> bytes:
    """One landing line: an event with an id and hostile values (keys repeated, some missing),
    maybe wrapped in hostile bytes (BOM, CRLF, NUL, invalid UTF-8, not JSON at all, a root array
    of it, UTF-16)."""
    members = [("id", str(event_id))] if draw(st.integers(0, 9)) else []
    members += draw(st.lists(st.tuples(st.sampled_from(sorted(COLUMNS)), VALUE), max_size=6))
    text = ("{" + ", ".join(f'"{name}": {value}' for name, value in members) + "}").encode()
    wrapping = draw(st.sampled_from(wrappings))
    return {
        "plain": text,
        "bom": "\ufeff".encode() + text,
        "crlf": text + b"\r",
        "nul": text[:-1] + b', "s": "\x00"}',
        "utf8": text[:-1] + b', "s": "\xff\xfe\xc3("}',
        "truncated": text[: len(text) // 2],
        "scalar": b"42",
        "array": b"[" + text + b", " + text + b"]",
        "utf16": text.decode().encode("utf-16-le"),
    }[wrapping]


@pytest.fixture(scope="module")
def hostile_home(tmp_path_factory):
    """One home, with the hostile stream's table, for all examples: each end-to-end example lands
    one more batch. Its session generates code, as a user's does: how Spark evaluates hostile
    values is these tests' subject."""
    home = tmp_path_factory.mktemp("hostile")
    (home / "lakehouse.yaml").write_text(json.dumps({"streams": [HOSTILE_STREAM]}))
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("LAKEHOUSE_HOME", str(home / "lakehouse"))
        monkeypatch.setenv("LAKEHOUSE_CONFIG", str(home / "lakehouse.yaml"))
        lake = Lakehouse.from_env()
        spark = generate_code(lakehouse_session(lake))
        ensure_table(spark, lake, lake.stream("hostile"), list)
        yield lake, spark, Counter()


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), final_newline=st.booleans())
def test_any_line_becomes_a_row_or_a_dead_letter_and_never_fails_the_job(hostile_home, data, final_newline):
    """End to end, a few examples: each lands a batch of hostile lines, stages and commits it."""
    lake, spark, totals = hostile_home
    first_id = sum(totals.values()) + 1
    wrappings = READ_ALIKE + (READ_OTHERWISE if data.draw(st.booleans()) else [])
    lines = [data.draw(hostile_line(first_id + n, wrappings)) for n in range(data.draw(st.integers(1, 12)))]
    directory = landing_dir(lake.paths, lake.stream("hostile"))
    directory.mkdir(parents=True, exist_ok=True)
    name = f"{first_id:08d}.ndjson"
    (directory / f".{name}").write_bytes(b"\n".join(lines) + (b"\n" if final_newline else b""))
    (directory / f".{name}").rename(directory / name)

    batch, _ = mint_next_batch(lake, lake.stream("hostile"), drain=True)
    staged = stage_batch(spark, lake, lake.stream("hostile"), batch.sequence).staged
    commit_table(spark, lake, "h.events", f"run-{batch.sequence}")

    non_blank = sum(1 for line in lines if line.strip(b" \t\r"))
    assert staged.rows + staged.rejected == non_blank
    totals["rows"] += staged.rows
    totals["rejected"] += staged.rejected
    ids = [row[0] for row in _duckdb_rows(lake, "h.events", "id")]
    assert len(ids) == len(set(ids)) == totals["rows"], "every accepted line is one row"
    dead = _dead_letters(lake, "h.events_dead_letters") if totals["rejected"] else []
    assert len(dead) == totals["rejected"], "every rejected line is one dead letter"
    # Conversion is total on its own: the safety net that isolates Spark failures is never needed.
    assert not [reason for _, _, reason, _ in dead if reason.startswith(SPARK_FAILURE)]


# The conversion's expressions with every field parsed as text (``TYPED_PARSE_TYPES`` empty), built
# once per JVM as the cached ones are; called only with that patched in, so its cache holds them alone.
TEXT_ONLY_CONVERSION = cached_columns(conversion._conversion.__wrapped__)

# Landing files of each example of the conversion property, in two parts: the first part's lines
# are wrapped only in ways Spark's JSON file reader reads as the typed parse does, so that reader is
# held to the text's conversion in every example; the second part's in any way, so that files it
# would read otherwise are in every example too. Each example converts all its files in one Spark
# pass per reading (and each part once more from its text and, where it reads alike, by the file
# reader): an example costs its passes' planning far more than its lines. Two examples of 18 files
# check as many drawn files as three of 12 did (the fourth, hypothesis's simplest, every line
# ``{}``, is skipped below), in 10 passes instead of about 14.
FILES_PER_PART = 9
PART_WRAPPINGS = (READ_ALIKE, READ_ALIKE + READ_OTHERWISE)


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_line_converts_to_a_row_or_a_reason_alike_whichever_way_it_is_read(hostile_home, data, tmp_path):
    """The conversion alone, on many batches: every non-blank line of every file is one row or one
    rejected event; parsing every field as text gives the same rows and reasons as the typed parse
    (a shortcut only), and so does Spark's JSON file reader wherever it reads the lines alike."""
    lake, spark, _ = hostile_home
    # A directory of its own (hypothesis may run an example twice: a name drawn from it can repeat).
    example = Path(tempfile.mkdtemp(prefix="example-", dir=tmp_path))
    parts = []
    for part, wrappings in enumerate(PART_WRAPPINGS):
        files, lines = [], []
        for number in range(part * FILES_PER_PART, (part + 1) * FILES_PER_PART):
            file_lines = [
                data.draw(hostile_line(number * 100 + n, wrappings)) for n in range(data.draw(st.integers(1, 12)))
            ]
            path = example / f"{number:04d}.ndjson"
            path.write_bytes(b"\n".join(file_lines) + (b"\n" if data.draw(st.booleans()) else b""))
            files.append(str(path))
            lines += file_lines
        parts.append((files, lines))
    files = [file for part_files, _ in parts for file in part_files]
    lines = [line for _, part_lines in parts for line in part_lines]
    # Hypothesis runs its simplest example first: every line ``{}``, which the drawn examples hold
    # among their lines anyway. Skipped before any Spark pass, so both examples are drawn ones.
    assume(any(line != b"{}" for line in lines))

    typed_first = _converted(spark, lake, files, example / "typed")
    assert len(typed_first) == sum(1 for line in lines if line.strip(b" \t\r")), "one row or reason per line"
    # Every field parsed as text: the conversion's columns from their own cache (the usual one's parse typed).
    text_only = mock.patch.object(conversion, "TYPED_PARSE_TYPES", ())
    with text_only, mock.patch.object(conversion, "_conversion", TEXT_ONLY_CONVERSION):
        assert _converted(spark, lake, files, example / "text") == typed_first
    rejected = 0
    for part, (part_files, part_lines) in enumerate(parts):
        from_text, from_files = _converted_from_files(spark, lake, part_files, example / f"files-{part}")
        assert (from_files is not None) == all(map(line_read_alike, part_lines))
        assert from_files in (None, from_text)
        rejected += from_text[1]
    assert rejected == sum(1 for row in typed_first if json.loads(row).get(REASON_COLUMN) is not None)


def _converted(spark, lake, files, links):
    """The landing files' lines converted to the hostile table's schema: every column of every line
    (row or rejected event with its reason) as JSON text, in file and line order."""
    schema = conversion.with_iceberg_types(spark.table("lake.h.events").schema, lake.table("h.events").schema())
    lines = read_landing_lines(spark, files, links)
    converted = conversion.convert_events(lines, schema, lake.stream("hostile"), [])
    rows = converted.select(SOURCE_FILE_COLUMN, LINE_COLUMN, F.to_json(F.struct("*")).alias("row")).collect()
    return [row["row"] for row in sorted(rows, key=lambda row: (row[SOURCE_FILE_COLUMN], row[LINE_COLUMN]))]


def _converted_from_files(spark, lake, files, links):
    """The landing files' lines converted twice, as ``_accepted``: from the text of each line, and
    from Spark's JSON file reader (None when it would read a line differently)."""
    schema = conversion.with_iceberg_types(spark.table("lake.h.events").schema, lake.table("h.events").schema())
    stream = lake.stream("hostile")
    lines = read_landing_lines(spark, files, links)
    from_text = _accepted(conversion.convert_events(lines, schema, stream, []), schema)
    events = read_parsed_events(spark, files, links, conversion.row_fields(schema))
    from_files = None if events is None else _accepted(conversion.convert_parsed_events(events, schema, stream), schema)
    return from_text, from_files


def _accepted(converted, schema):
    """The accepted rows (each as JSON text), sorted, and the number of rejected events."""
    columns = [F.col(f"`{name}`") for name in schema.fieldNames()]
    rows = converted.select(F.to_json(F.struct(*columns)).alias("row"), REASON_COLUMN).collect()
    rejected = sum(1 for row in rows if row[REASON_COLUMN] is not None)
    return sorted(row["row"] for row in rows if row[REASON_COLUMN] is None), rejected


def _debezium(op: str, key: int, name: str | None, lsn: int) -> str:
    row = {"id": key, "name": name, "amount": None, "ts": None}
    return json.dumps(
        {
            "before": row if op == "d" else None,
            "after": None if op == "d" else row,
            "op": op,
            "source": {"connector": "postgresql", "lsn": lsn},
        }
    )


def _stale_counts(lake):
    from lakehouse_assets.commit import summary_keys

    table = lake.table("crm.customers")
    return [
        int(snapshot.summary.additional_properties.get(summary_keys.STALE_CHANGES, "0"))
        for snapshot in table.snapshots()
        if summary_keys.STREAM in snapshot.summary.additional_properties
    ]


def _run_batches(lake, instance, batches):
    defs = build_definitions(lake.config)
    for batch in batches:
        land_events(lake.paths, lake.stream("customers"), batch)
        assert run_until_idle(defs, instance, log=lambda _: None).failed == []


def _change_checks_passed(instance) -> bool:
    import dagster as dg

    from lakehouse_assets.defs import names

    key = names.table_key("crm.customers")
    records = [
        instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(key, name))
        for name in names.CHECK_NAMES + names.CHANGE_CHECK_NAMES
    ]
    return all(record.status.value == "SUCCEEDED" for record in records)


def test_a_late_change_never_overwrites_a_newer_one(lakehouse_home, tmp_path, monkeypatch, instance):
    from lakehouse_assets_tests.test_changes import customers_stream

    write_config(tmp_path, {"streams": [customers_stream("2", "debezium")]}, monkeypatch)
    lake = Lakehouse.from_env()

    _run_batches(
        lake,
        instance,
        [
            [_debezium("c", 1, "first", 100), _debezium("u", 1, "newest", 300), _debezium("c", 2, "two", 110)],
            # A connector restart redelivers key 1's change at lsn 200; key 2 moves on.
            [_debezium("u", 1, "redelivered", 200), _debezium("u", 2, "two again", 310)],
            [_debezium("d", 1, None, 250)],  # a stale delete: key 1 stays
        ],
    )

    assert _duckdb_rows(lake, "crm.customers", "id, name, _lakehouse_source_position.lsn") == [
        (1, "newest", 300),
        (2, "two again", 310),
    ]
    assert _stale_counts(lake) == [0, 1, 1]
    assert _change_checks_passed(instance)


def test_a_version_column_orders_plain_change_events(lakehouse_home, tmp_path, monkeypatch, instance):
    from lakehouse_assets_tests.test_changes import customers_stream

    stream = customers_stream("2", "json")
    stream["schema"]["columns"].append({"name": "version", "type": "long"})
    write_config(tmp_path, {"streams": [{**stream, "version_column": "version"}]}, monkeypatch)
    lake = Lakehouse.from_env()

    def change(op, key, name, version):
        return json.dumps({"op": op, "id": key, "name": name, "version": version})

    _run_batches(
        lake,
        instance,
        [
            # Within a batch the highest version wins, whatever the landing order.
            [change("c", 1, "v5", 5), change("u", 1, "v4", 4), change("c", 2, "v1", 1)],
            [change("u", 1, "v3", 3), change("d", 2, None, 0), change("u", 2, "v2", 2)],
        ],
    )

    assert _duckdb_rows(lake, "crm.customers", "id, name, version") == [(1, "v5", 5), (2, "v2", 2)]
    assert _stale_counts(lake) == [0, 1]
    assert _change_checks_passed(instance)
