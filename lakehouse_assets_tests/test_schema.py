"""Types, inference and conversion: properties of the rules, and nested and inferred tables end to end."""

import base64
import datetime as dt
import json
from decimal import Decimal
from uuid import UUID

import dagster as dg
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from pyiceberg.schema import Schema
from pyiceberg.types import FixedType, NestedField, UUIDType
from pyspark.sql import types as T

from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.batches.staged_format import EVENT_COLUMN, LINE_COLUMN, REASON_COLUMN, SOURCE_FILE_COLUMN
from lakehouse_assets.batches.staged_rows import read_staged
from lakehouse_assets.catalog.iceberg_types import parse_type, type_name
from lakehouse_assets.config.spec import parse_config
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.engine.local_rows import rows_frame
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.ingest.conversion import convert_events, with_iceberg_types
from lakehouse_assets.ingest.inference import infer_type
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets.runner import run_until_idle
from lakehouse_assets_tests.conftest import write_config
from lakehouse_assets_tests.test_pipeline import _duckdb_rows

NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True)
SCALARS = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text()
JSON_VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(NAMES, inner, max_size=4)
)


@given(JSON_VALUES)
def test_inference_follows_the_rules_and_names_a_parsable_type(value):
    inferred = infer_type(value)
    if value is None:
        assert inferred is None
        return
    expected_kind = {bool: "boolean", int: "long", float: "double", str: "string"}.get(type(value))
    if expected_kind:
        assert inferred == expected_kind
    elif not value:
        assert inferred == "string"  # empty objects and arrays
    elif isinstance(value, list):
        assert inferred == f"list<{infer_type(value[0]) or 'string'}>"
    else:
        assert inferred == "struct<" + ", ".join(f"{k}: {infer_type(v) or 'string'}" for k, v in value.items()) + ">"
    assert type_name(parse_type(inferred)) == inferred


EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
ENCODED = {
    "long": st.integers(-(2**63), 2**63 - 1).flatmap(lambda n: st.sampled_from([(n, n), (str(n), n), (f" {n} ", n)])),
    "double": st.floats(allow_nan=False, allow_infinity=False).flatmap(
        lambda x: st.sampled_from([(x, x), (repr(x), x)])
    ),
    "boolean": st.booleans().flatmap(
        lambda b: st.sampled_from([(b, b), (str(b).lower(), b), (str(b).upper(), b), ("maybe", None)])
    ),
    "date": st.dates(dt.date(1900, 1, 1), dt.date(2200, 1, 1)).flatmap(
        lambda d: st.sampled_from([(d.isoformat(), d), ((d - dt.date(1970, 1, 1)).days, d)])
    ),
    "timestamptz": st.datetimes(dt.datetime(1971, 1, 1), dt.datetime(2200, 1, 1))
    .map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000, tzinfo=dt.timezone.utc))
    .flatmap(lambda t: st.sampled_from([(t.isoformat(), t), ((t - EPOCH) // dt.timedelta(milliseconds=1), t)])),
    "binary": st.binary(max_size=20).map(lambda b: (base64.b64encode(b).decode(), bytes(b))),
    "string": st.text().map(lambda s: (s, s)) | st.integers().map(lambda n: (n, str(n))),
    "uuid": st.uuids().flatmap(lambda u: st.sampled_from([(str(u), str(u)), (str(u).upper(), str(u)), (u.hex, None)])),
    "fixed[4]": st.binary(min_size=3, max_size=5).map(
        lambda b: (base64.b64encode(b).decode(), bytes(b) if len(b) == 4 else None)
    ),
}


@pytest.mark.spark
# Each example is a Spark job: no shrinking (minutes per failure); the failing example is printed whole.
@settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(st.fixed_dictionaries({kind: st.lists(values, min_size=1, max_size=8) for kind, values in ENCODED.items()}))
def test_conversion_coerces_every_encoding_the_rfc_accepts(tmp_path_factory, samples):
    home = tmp_path_factory.mktemp("conversion")
    config = parse_config({"streams": [{"name": "s", "table_identifier": "db.s"}]})
    spark = lakehouse_session(Lakehouse(config, LakehousePaths(home, home)))
    kinds = {"long": T.LongType(), "double": T.DoubleType(), "boolean": T.BooleanType(), "date": T.DateType()}
    kinds |= {"timestamptz": T.TimestampType(), "binary": T.BinaryType(), "string": T.StringType()}
    schema = T.StructType([T.StructField(kind, data_type) for kind, data_type in kinds.items()])
    # Spark reads uuid and fixed[N] as string and binary; the Iceberg type rides in the field's metadata.
    schema = with_iceberg_types(
        T.StructType([*schema, T.StructField("uuid", T.StringType()), T.StructField("fixed[4]", T.BinaryType())]),
        Schema(
            NestedField(1, "uuid", UUIDType(), required=False), NestedField(2, "fixed[4]", FixedType(4), required=False)
        ),
    )
    rows = max(len(values) for values in samples.values())
    events = [
        json.dumps({kind: values[i][0] for kind, values in samples.items() if i < len(values)}) for i in range(rows)
    ]
    lines = rows_frame(
        spark,
        [{EVENT_COLUMN: event, SOURCE_FILE_COLUMN: "f", LINE_COLUMN: i + 1} for i, event in enumerate(events)],
        f"{EVENT_COLUMN} string, {SOURCE_FILE_COLUMN} string, {LINE_COLUMN} long",
    )

    converted = convert_events(lines, schema, config.stream("s"), []).orderBy("_lakehouse_line").collect()

    for i, row in enumerate(converted):
        assert row[REASON_COLUMN] is None
        for kind, values in samples.items():
            expected = values[i][1] if i < len(values) else None
            actual = row[kind]
            if kind == "timestamptz" and actual is not None:
                actual = actual.astimezone(dt.timezone.utc)
            assert actual == expected, (kind, values[i][0] if i < len(values) else None)


NESTED = {
    "name": "profiles",
    "table_identifier": "crm.profiles",
    "auto_create": True,
    "schema": {
        "columns": [
            {"name": "id", "type": "long", "required": True},
            {"name": "address", "type": "struct<city: string, zip: int, geo: struct<lat: double, lon: double>>"},
            {"name": "tags", "type": "list<string>"},
            {"name": "scores", "type": "map<string, decimal(5,2)>"},
            {"name": "visits", "type": "list<struct<day: date, pages: int>>"},
        ]
    },
    "commit_interval": "0s",
}


@pytest.mark.spark
def test_nested_columns_are_created_converted_recursively_and_checked(paths, tmp_path, monkeypatch, instance):
    write_config(tmp_path, {"streams": [NESTED]}, monkeypatch)
    lake = Lakehouse.from_env()
    events = [
        {"id": 1, "address": {"city": "Lyon", "zip": "69001", "geo": {"lat": "45.76", "lon": 4.83}}, "tags": ["a", 1]},
        {"id": 2, "address": {"city": "Oslo", "zip": "n/a", "extra": True}, "scores": {"x": "1.25", "y": "bad"}},
        {"id": 3, "address": "not an object", "visits": [{"day": "2026-11-01", "pages": "3"}, {"day": 20394}]},
        {"address": {"city": "Nowhere"}},
    ]
    land_events(paths, lake.stream("profiles"), [json.dumps(event) for event in events])

    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []

    rows = _duckdb_rows(lake, "crm.profiles", "id, address, tags, scores, visits")
    assert rows[0][:3] == (1, {"city": "Lyon", "zip": 69001, "geo": {"lat": 45.76, "lon": 4.83}}, ["a", "1"])
    assert rows[1][1] == {"city": "Oslo", "zip": None, "geo": None}
    assert {key: (float(value) if value is not None else None) for key, value in rows[1][3].items()} == {
        "x": 1.25,
        "y": None,
    }
    assert rows[2][1] is None
    assert rows[2][4] == [
        {"day": dt.date(2026, 11, 1), "pages": 3},
        {"day": dt.date(1970, 1, 1) + dt.timedelta(days=20394), "pages": None},
    ]
    dead = _duckdb_rows(lake, "crm.profiles_dead_letters", "reason")
    assert dead == [("missing required field 'id'",)]
    key = names.table_key("crm.profiles")
    record = instance.get_latest_asset_check_evaluation_record(
        __import__("dagster").AssetCheckKey(key, names.SCHEMA_CHECK)
    )
    assert record.status.value == "SUCCEEDED"


def _without_ids(field_type) -> str:
    if hasattr(field_type, "fields"):
        return "struct<" + ", ".join(f"{f.name}: {_without_ids(f.field_type)}" for f in field_type.fields) + ">"
    return str(field_type)


INFERRED = {"name": "clicks", "table_identifier": "web.clicks", "auto_create": True, "commit_interval": "0s"}


@pytest.mark.spark
def test_a_table_without_declared_columns_is_created_from_the_first_batch(paths, tmp_path, monkeypatch, instance):
    write_config(tmp_path, {"streams": [INFERRED]}, monkeypatch)
    lake = Lakehouse.from_env()
    events = [
        {"user": 7, "page": "/a", "ok": True, "ms": 12.5, "meta": {"ua": "x", "dpr": 2}, "tags": ["t"], "gone": None},
        {"user": "8", "page": "/b", "ok": "false", "ms": 3, "meta": {}, "tags": [], "later": 1, "empty": {}},
    ]
    land_events(paths, lake.stream("clicks"), [json.dumps(event) for event in events])

    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []

    schema = lake.table("web.clicks").schema()
    inferred = {field.name: _without_ids(field.field_type) for field in schema.fields}
    assert inferred == {
        "user": "long",
        "page": "string",
        "ok": "boolean",
        "ms": "double",
        "meta": "struct<ua: string, dpr: long>",
        "tags": "list<string>",
        "gone": "string",
        "later": "long",
        "empty": "string",
    }
    rows = _duckdb_rows(lake, "web.clicks", "user, ok, ms, meta, later")
    assert rows == [(7, True, 12.5, {"ua": "x", "dpr": 2}, None), (8, False, 3.0, {"ua": None, "dpr": None}, 1)]


EVERY_TYPE = {
    "name": "assets",
    "table_identifier": "inventory.assets",
    "auto_create": True,
    "schema": {
        "columns": [
            {"name": "asset_id", "type": "uuid", "required": True},
            {"name": "ok", "type": "boolean"},
            {"name": "count", "type": "int"},
            {"name": "total", "type": "long"},
            {"name": "ratio", "type": "float"},
            {"name": "weight", "type": "double"},
            {"name": "price", "type": "decimal(9,2)"},
            {"name": "bought_on", "type": "date"},
            {"name": "due_on", "type": "date"},
            {"name": "seen_at", "type": "timestamp"},
            {"name": "updated_at", "type": "timestamptz"},
            {"name": "label", "type": "string"},
            {"name": "blob", "type": "binary"},
            {"name": "checksum", "type": "fixed[4]"},
            {"name": "owner", "type": "struct<id: uuid, tag: fixed[2]>"},
            {"name": "parts", "type": "list<string>"},
            {"name": "sizes", "type": "map<string, long>"},
        ],
        "partition_spec": [
            {"column": "label"},
            {"column": "bought_on", "transform": "year"},
            {"column": "updated_at", "transform": "month"},
            {"column": "due_on", "transform": "day"},
            {"column": "seen_at", "transform": "hour"},
            {"column": "asset_id", "transform": "bucket[4]"},
            {"column": "label", "transform": "truncate[2]"},
        ],
    },
    "table_properties": {"format-version": "2", "write.parquet.compression-codec": "zstd"},
    "commit_interval": "0s",
}


@pytest.mark.spark
def test_every_type_and_transform_is_created_and_uuid_and_fixed_values_are_checked(tmp_path, monkeypatch, instance):
    write_config(tmp_path, {"streams": [EVERY_TYPE]}, monkeypatch)
    lake = Lakehouse.from_env()
    key = "F81D4FAE-7DEC-11D0-A765-00A0C91E6BF6"
    events = [
        {"asset_id": key, "count": "3", "price": "19.99", "bought_on": "2026-01-02", "due_on": 20454,
         "seen_at": "2026-11-25T10:30:00", "updated_at": 1764064800000, "label": "pump", "blob": "AAE=",
         "checksum": "AQIDBA==", "owner": {"id": key.lower(), "tag": "AQI="}, "parts": ["a"], "sizes": {"a": "2"}},
        {"asset_id": "123e4567-e89b-12d3-a456-426614174000", "label": "valve", "checksum": "AQI=",
         "owner": {"id": "nope", "tag": "AQIDBA=="}},
        {"asset_id": "not-a-uuid", "label": "bad key"},
    ]  # fmt: skip
    land_events(lake.paths, lake.stream("assets"), [json.dumps(event) for event in events])

    assert run_until_idle(build_definitions(lake.config), instance, log=lambda _: None).failed == []

    table = lake.table("inventory.assets")
    assert table.properties["write.parquet.compression-codec"] == "zstd"
    assert [str(field.transform) for field in table.spec().fields] == [
        "identity", "year", "month", "day", "hour", "bucket[4]", "truncate[2]"
    ]  # fmt: skip
    columns = "label, asset_id::VARCHAR, count, price, checksum, owner, sizes"
    rows = {row[0]: row[1:] for row in _duckdb_rows(lake, "inventory.assets", columns)}
    owner = {"id": UUID(key), "tag": b"\x01\x02"}
    assert rows["pump"] == (key.lower(), 3, Decimal("19.99"), b"\x01\x02\x03\x04", owner, {"a": 2})
    assert rows["valve"][3:5] == (None, {"id": None, "tag": None})  # wrong length, not a uuid: NULL
    dead = _duckdb_rows(lake, "inventory.assets_dead_letters", "reason")
    assert dead == [("required field 'asset_id': not-a-uuid is not a uuid",)]
    check = instance.get_latest_asset_check_evaluation_record(
        dg.AssetCheckKey(names.table_key("inventory.assets"), names.SCHEMA_CHECK)
    )
    assert check.status.value == "SUCCEEDED"
    # The committer read the staged batch with the schema Spark recorded in its files: the same
    # columns, types (the uuid and fixed[N] annotations too) and rows as Spark's own read infers.
    spark = lakehouse_session(lake)
    [batch] = lake.ledger("assets").batches()
    recorded, inferred = read_staged(spark, batch.events_path()), spark.read.parquet(str(batch.events_path()))
    assert recorded.schema == inferred.schema
    assert sorted(recorded.toJSON().collect()) == sorted(inferred.toJSON().collect())
