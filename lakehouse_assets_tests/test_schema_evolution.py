"""Schema evolution through the real pipeline: new fields become columns before their batch
commits, values that outgrow their column's type promote it as Iceberg allows, otherwise the first
type wins, every change is recorded, and a crash mid-change loses nothing."""

import json
import signal

import dagster as dg
import pytest

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.catalog.iceberg_types import iceberg_type_name
from lakehouse_assets.catalog.table_metadata import qualified_name
from lakehouse_assets.commit import summary_keys
from lakehouse_assets.config.loader import load_config
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.ingest.micro_batching import mint_next_batch
from lakehouse_assets.ingest.staging import stage_batch
from lakehouse_assets.ingest.table_commits import commit_table
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.quality.duck import iceberg_connection, scan
from lakehouse_assets.runner import run_until_idle
from lakehouse_assets_tests.conftest import write_config
from lakehouse_assets_tests.fault_injection.pipeline import run_lakehouse

pytestmark = pytest.mark.spark

EVOLVING = {
    "name": "events",
    "table_identifier": "web.events",
    "auto_create": True,
    "schema_evolution": True,
    "schema": {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "kind", "type": "string"}]},
    "commit_interval": "0s",
}


@pytest.fixture
def evolving(lakehouse_home, tmp_path, monkeypatch):
    write_config(tmp_path, {"streams": [EVOLVING]}, monkeypatch)
    return load_config()


def _columns(lake):
    return {field.name: iceberg_type_name(field.field_type) for field in lake.table("web.events").schema().fields}


def _rows(lake, *columns):
    table = lake.table("web.events")
    return sorted(tuple(row.values()) for row in table.scan(selected_fields=columns).to_arrow().to_pylist())


def test_new_fields_become_columns_recorded_in_the_commit_and_checked(evolving, paths, instance):
    lake = Lakehouse(evolving, paths)
    events = [{"id": 1, "kind": "a"}, {"id": 2, "kind": "b", "score": 1.5, "meta": {"x": 1}}]
    land_events(paths, evolving.stream("events"), [json.dumps(event) for event in events])

    assert run_until_idle(build_definitions(evolving), instance, log=lambda _: None).failed == []

    columns = _columns(lake)
    assert list(columns) == ["id", "kind", "meta", "score"] and columns["score"] == "double"
    summary = lake.table("web.events").current_snapshot().summary.additional_properties
    assert set(json.loads(summary[summary_keys.SCHEMA_CHANGE])) == {"meta", "score"}
    key = names.table_key("web.events")
    materialization = instance.get_latest_materialization_event(key).asset_materialization
    assert set(materialization.metadata["schema_change"].value) == {"meta", "score"}
    assert materialization.metadata["schema_change_batches"].value == {"meta": 1, "score": 1}
    check = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(key, names.SCHEMA_CHECK))
    assert check.status.value == "SUCCEEDED"
    assert _rows(lake, "id", "score") == [(1, None), (2, 1.5)]

    # A later value that does not fit the column's type is NULL; a new field is added again.
    land_events(paths, evolving.stream("events"), [json.dumps({"id": 3, "score": "high", "tag": "t"})])
    assert run_until_idle(build_definitions(evolving), instance, log=lambda _: None).failed == []
    assert _rows(lake, "id", "score", "tag") == [(1, None, None), (2, 1.5, None), (3, None, "t")]
    summary = lake.table("web.events").current_snapshot().summary.additional_properties
    assert json.loads(summary[summary_keys.SCHEMA_CHANGE]) == {"tag": "string"}
    assert json.loads(summary[summary_keys.SCHEMA_CHANGE_BATCHES]) == {"tag": 2}


def test_the_first_committed_type_wins_for_batches_staged_with_different_types(evolving, paths):
    lake = Lakehouse(evolving, paths)
    spark = lakehouse_session(lake)
    stream = evolving.stream("events")
    for events in ([{"id": 1, "level": 5}], [{"id": 2, "level": "7"}, {"id": 3, "level": "loud"}]):
        land_events(paths, stream, [json.dumps(event) for event in events])
        batch, _ = mint_next_batch(lake, stream, drain=True)
        stage_batch(spark, lake, stream, batch.sequence)

    commit_table(spark, lake, "web.events", "test")

    assert _columns(lake)["level"] == "long"
    assert _rows(lake, "id", "level") == [(1, 5), (2, 7), (3, None)]


def test_struct_fields_from_batches_staged_apart_are_all_added_and_the_first_type_wins(evolving, paths):
    lake = Lakehouse(evolving, paths)
    spark = lakehouse_session(lake)
    stream = evolving.stream("events")
    batches = (
        [{"id": 1, "meta": {"x": 1}}],
        [{"id": 2, "meta": {"x": 2, "y": 5}}],
        [{"id": 3, "meta": {"y": "seven", "z": {"deep": True}}}, {"id": 4, "meta": {"y": "8"}}],
    )
    for events in batches:  # all staged before any commits: each proposes `meta` with other fields
        land_events(paths, stream, [json.dumps(event) for event in events])
        batch, _ = mint_next_batch(lake, stream, drain=True)
        stage_batch(spark, lake, stream, batch.sequence)

    commit_table(spark, lake, "web.events", "test")

    assert _columns(lake)["meta"] == "struct<x: long, y: long, z: struct<deep: boolean>>"
    assert _rows(lake, "id", "meta") == [
        (1, {"x": 1, "y": None, "z": None}),
        (2, {"x": 2, "y": 5, "z": None}),
        (3, {"x": None, "y": None, "z": {"deep": True}}),
        (4, {"x": None, "y": 8, "z": None}),
    ]
    # A later batch's new struct field is added to the existing column and recorded by its path.
    land_events(paths, stream, [json.dumps({"id": 5, "meta": {"x": 6, "w": "new"}})])
    batch, _ = mint_next_batch(lake, stream, drain=True)
    stage_batch(spark, lake, stream, batch.sequence)
    commit_table(spark, lake, "web.events", "test")
    summary = lake.table("web.events").current_snapshot().summary.additional_properties
    assert json.loads(summary[summary_keys.SCHEMA_CHANGE]) == {"meta.w": "string"}


def test_a_crash_after_the_schema_change_before_the_commit_loses_nothing(evolving, paths):
    lake = Lakehouse(evolving, paths)
    land_events(paths, evolving.stream("events"), [json.dumps({"id": 1, "kind": "a", "score": 2.5})])

    crashed = run_lakehouse(["run", "--until-idle"], {faults.CRASH_ENV: faults.COMMITTER_AFTER_SCHEMA_CHANGE})

    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    assert "score" in _columns(lake)
    assert lake.table("web.events").current_snapshot() is None
    restarted = run_lakehouse(["run", "--until-idle"])
    assert restarted.returncode == 0, restarted.stdout[-2000:] + restarted.stderr[-2000:]
    assert _rows(lake, "id", "kind", "score") == [(1, "a", 2.5)]
    summary = lake.table("web.events").current_snapshot().summary.additional_properties
    assert json.loads(summary[summary_keys.SCHEMA_CHANGE]) == {"score": "double"}


NARROW_COLUMNS = [
    {"name": "id", "type": "long", "required": True},
    {"name": "count", "type": "int"},
    {"name": "ratio", "type": "float"},
    {"name": "amount", "type": "decimal(6,2)"},
    {"name": "point", "type": "struct<x: int>"},
    {"name": "tags", "type": "list<int>"},
    {"name": "scores", "type": "map<string, float>"},
]
NARROW = {**EVOLVING, "schema": {"columns": NARROW_COLUMNS}}


def _duck_rows(lake, columns: str, identifier: str = "web.events") -> list[tuple]:
    """The table's rows as DuckDB reads its committed snapshot."""
    table = lake.require_table(identifier)
    location = lake.metadata_location(identifier)
    query = f"SELECT {columns} FROM {scan(location, table.current_snapshot().snapshot_id)} ORDER BY ALL"
    return iceberg_connection().sql(query).fetchall()


def test_values_that_outgrow_their_types_promote_the_columns_with_every_value_intact(
    lakehouse_home, tmp_path, monkeypatch, paths, instance
):
    write_config(tmp_path, {"streams": [NARROW]}, monkeypatch)
    config = load_config()
    lake = Lakehouse(config, paths)
    stream = config.stream("events")
    first = {"id": 1, "count": 7, "ratio": 0.5, "amount": 12.34, "point": {"x": 1}, "tags": [1], "scores": {"a": 0.5}}
    land_events(paths, stream, [json.dumps(first)])
    assert run_until_idle(build_definitions(config), instance, log=lambda _: None).failed == []
    assert _columns(lake) == {
        "id": "long",
        "count": "int",
        "ratio": "float",
        "amount": "decimal(6,2)",
        "point": "struct<x: int>",
        "tags": "list<int>",
        "scores": "map<string, float>",
    }

    # Each value needs the wider type Iceberg promotes its column to; one value no promotion holds.
    outgrown = {
        "id": 2,
        "count": 3_000_000_000,
        "ratio": 1e300,
        "amount": 123456.78,
        "point": {"x": 5_000_000_000},
        "tags": [2, 4_000_000_000],
        "scores": {"b": 1e300, "c": 1.5},
    }
    land_events(paths, stream, [json.dumps(outgrown), json.dumps({"id": 3, "count": "many", "amount": 1.5})])
    assert run_until_idle(build_definitions(config), instance, log=lambda _: None).failed == []

    assert _columns(lake) == {
        "id": "long",
        "count": "long",
        "ratio": "double",
        "amount": "decimal(8,2)",
        "point": "struct<x: long>",
        "tags": "list<long>",
        "scores": "map<string, double>",
    }
    assert _duck_rows(lake, "id, count, ratio, amount::VARCHAR, point.x, tags, scores['b']") == [
        (1, 7, 0.5, "12.34", 1, [1], None),
        (2, 3_000_000_000, 1e300, "123456.78", 5_000_000_000, [2, 4_000_000_000], 1e300),
        (3, None, None, "1.50", None, None, None),
    ]
    summary = lake.table("web.events").current_snapshot().summary.additional_properties
    promoted = {
        "amount": "decimal(8,2)",
        "count": "long",
        "point.x": "long",
        "ratio": "double",
        "scores.value": "double",
        "tags.element": "long",
    }
    assert json.loads(summary[summary_keys.SCHEMA_CHANGE]) == promoted
    key = names.table_key("web.events")
    materialization = instance.get_latest_materialization_event(key).asset_materialization
    assert materialization.metadata["schema_change"].value == promoted
    # The one value no promotion holds is NULL, and said so: on the commit, and by the dead-letter check.
    assert materialization.metadata["uncoercible_values"].value == {"count": 1}
    assert json.loads(summary[summary_keys.UNCOERCIBLE_VALUES]) == {"count": 1}
    warned = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(key, names.DEAD_LETTERS_CHECK))
    assert warned.status.value == "FAILED"
    assert "count 1" in warned.event.dagster_event.event_specific_data.description
    # The declared types were promoted, not broken: the schema check passes.
    check = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(key, names.SCHEMA_CHECK))
    assert check.status.value == "SUCCEEDED"


def test_batches_staged_apart_promote_a_decimal_to_the_widest_precision_any_needs(
    lakehouse_home, tmp_path, monkeypatch, paths
):
    write_config(tmp_path, {"streams": [NARROW]}, monkeypatch)
    config = load_config()
    lake = Lakehouse(config, paths)
    spark = lakehouse_session(lake)
    stream = config.stream("events")
    for events in ([{"id": 1, "amount": 1.25}], [{"id": 2, "amount": 123456.78}], [{"id": 3, "amount": 12345678.9}]):
        land_events(paths, stream, [json.dumps(event) for event in events])
        batch, _ = mint_next_batch(lake, stream, drain=True)
        stage_batch(spark, lake, stream, batch.sequence)

    commit_table(spark, lake, "web.events", "test")

    assert _columns(lake)["amount"] == "decimal(10,2)"
    assert _duck_rows(lake, "id, amount::VARCHAR") == [(1, "1.25"), (2, "123456.78"), (3, "12345678.90")]


def test_a_float_beyond_its_range_is_null_never_infinity_without_schema_evolution(
    lakehouse_home, tmp_path, monkeypatch, paths, instance
):
    write_config(tmp_path, {"streams": [{**NARROW, "schema_evolution": False}]}, monkeypatch)
    config = load_config()
    lake = Lakehouse(config, paths)
    ratios = [1e300, -1e39, 2.5, "1e300"]
    land_events(paths, config.stream("events"), [json.dumps({"id": i, "ratio": r}) for i, r in enumerate(ratios)])

    assert run_until_idle(build_definitions(config), instance, log=lambda _: None).failed == []

    assert _columns(lake)["ratio"] == "float"
    assert _duck_rows(lake, "id, ratio") == [(0, None), (1, None), (2, 2.5), (3, None)]
    key = names.table_key("web.events")
    materialization = instance.get_latest_materialization_event(key).asset_materialization
    assert materialization.metadata["uncoercible_values"].value == {"ratio": 3}


def _committed(columns: list[dict], events: list[dict], tmp_path, monkeypatch, paths, instance) -> Lakehouse:
    """Land ``events`` in an evolving stream declared with ``columns`` and run the pipeline until
    idle (it must not fail); the lakehouse."""
    write_config(tmp_path, {"streams": [{**EVOLVING, "schema": {"columns": columns}}]}, monkeypatch)
    config = load_config()
    land_events(paths, config.stream("events"), [json.dumps(event) for event in events])
    assert run_until_idle(build_definitions(config), instance, log=lambda _: None).failed == []
    return Lakehouse(config, paths)


def test_fields_of_structs_inside_lists_and_maps_are_promoted_with_every_value_intact(
    lakehouse_home, tmp_path, monkeypatch, paths, instance
):
    columns = [
        {"name": "id", "type": "long", "required": True},
        {"name": "items", "type": "list<struct<qty: int, sku: string>>"},
        {"name": "prices", "type": "map<string, struct<amount: decimal(6,2), weights: list<float>>>"},
    ]
    events = [
        {"id": 1, "items": [{"qty": 2, "sku": "a"}], "prices": {"a": {"amount": 1.5, "weights": [0.5]}}},
        {"id": 2, "items": [{"qty": 1}, {"qty": 5_000_000_000, "sku": "b"}, None]},
        {"id": 3, "prices": {"b": {"amount": 123456.78, "weights": [1e300, 2.5]}, "c": None}},
    ]

    lake = _committed(columns, events, tmp_path, monkeypatch, paths, instance)

    promoted = {
        "items.element.qty": "long",
        "prices.value.amount": "decimal(8,2)",
        "prices.value.weights.element": "double",
    }
    summary = lake.table("web.events").current_snapshot().summary.additional_properties
    assert json.loads(summary[summary_keys.SCHEMA_CHANGE]) == promoted
    assert _columns(lake)["items"] == "list<struct<qty: long, sku: string>>"
    assert _columns(lake)["prices"] == "map<string, struct<amount: decimal(8,2), weights: list<double>>>"
    rows = _duck_rows(lake, "id, [item.qty FOR item IN items], prices['b'].amount::VARCHAR, prices['b'].weights")
    assert rows == [
        (1, [2], None, None),
        (2, [1, 5_000_000_000, None], None, None),
        (3, None, "123456.78", [1e300, 2.5]),
    ]
    assert summary_keys.UNCOERCIBLE_VALUES not in summary  # every value was held


def test_a_value_inside_a_struct_list_or_map_that_no_promotion_holds_is_null_and_counted_by_its_path(
    lakehouse_home, tmp_path, monkeypatch, paths, instance
):
    columns = [
        {"name": "id", "type": "long", "required": True},
        {"name": "point", "type": "struct<x: int, label: string>"},
        {"name": "geo", "type": "struct<pos: struct<lat: double>>"},
        {"name": "tags", "type": "list<int>"},
        {"name": "scores", "type": "map<int, double>"},
        {"name": "items", "type": "list<struct<qty: int, sku: string>>"},
        {"name": "prices", "type": "map<string, struct<amount: double>>"},
    ]
    events = [
        {"id": 1, "point": {"x": 5_000_000_000, "label": "far"}, "geo": {"pos": {"lat": 1.5}}, "tags": [4_000_000_000]},
        {"id": 2, "point": {"x": "east", "label": 7}, "geo": {"pos": {"lat": "north"}}, "tags": [1, "two", None]},
        {"id": 3, "point": {"x": None}, "geo": {"pos": "here"}, "scores": {"1": 0.5, "x": 1.0, "3": "high"}},
        {"id": 4, "point": "not an object", "scores": {"5": None}},
        {"id": 5, "items": [{"qty": "many", "sku": "z"}, "no object", {"qty": 3}], "prices": {"a": {"amount": "low"}}},
        {"id": 6, "items": [{"qty": 2, "sku": None}], "prices": {"a": {"amount": 2.5}, "b": 7}},
    ]

    lake = _committed(columns, events, tmp_path, monkeypatch, paths, instance)

    # The values that needed a wider type promoted their place; those no promotion holds are NULL
    # (a map entry whose key is no int is dropped: a key cannot be NULL).
    assert (_columns(lake)["point"], _columns(lake)["tags"]) == ("struct<x: long, label: string>", "list<long>")
    assert _duck_rows(lake, "id, point.x, point.label, geo.pos.lat, tags, scores") == [
        (1, 5_000_000_000, "far", 1.5, [4_000_000_000], None),
        (2, None, "7", None, [1, None, None], None),
        (3, None, None, None, None, {1: 0.5, 3: None}),
        (4, None, None, None, None, {5: None}),
        (5, None, None, None, None, None),
        (6, None, None, None, None, None),
    ]
    assert _duck_rows(lake, "id, items, prices", "web.events")[4:] == [
        (5, [{"qty": None, "sku": "z"}, None, {"qty": 3, "sku": None}], {"a": {"amount": None}}),
        (6, [{"qty": 2, "sku": None}], {"a": {"amount": 2.5}, "b": None}),
    ]
    # Each is counted where it was, by its path, inside a list's or a map's structs too (an event
    # counts once per place); a JSON null is no value to count.
    counted = {"point": 1, "point.x": 1, "geo.pos": 1, "geo.pos.lat": 1, "tags.element": 1, "scores.key": 1}
    counted |= {"scores.value": 1, "items.element": 1, "items.element.qty": 1, "prices.value": 1}
    counted["prices.value.amount"] = 1
    summary = lake.table("web.events").current_snapshot().summary.additional_properties
    assert json.loads(summary[summary_keys.UNCOERCIBLE_VALUES]) == counted
    key = names.table_key("web.events")
    metadata = instance.get_latest_materialization_event(key).asset_materialization.metadata
    assert metadata["uncoercible_values"].value == counted
    warned = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(key, names.DEAD_LETTERS_CHECK))
    assert warned.status.value == "FAILED"
    assert "geo.pos.lat 1" in warned.event.dagster_event.event_specific_data.description


def test_a_column_an_operator_renames_or_drops_while_a_batch_is_staged_is_matched_by_field_id(evolving, paths):
    lake = Lakehouse(evolving, paths)
    spark = lakehouse_session(lake)
    stream = evolving.stream("events")

    def stage(*events: dict) -> None:
        land_events(paths, stream, [json.dumps(event) for event in events])
        batch, _ = mint_next_batch(lake, stream, drain=True)
        stage_batch(spark, lake, stream, batch.sequence)

    stage({"id": 1, "kind": "a", "meta": {"x": 1, "y": "p"}})
    commit_table(spark, lake, "web.events", "test")
    # Staged under `kind` and `meta.x`; the operator renames both in Spark SQL before the batch
    # commits, and adds a new `meta.x` of another type: it is not the staged `x`.
    stage({"id": 2, "kind": "b", "meta": {"x": 2, "y": "q"}})
    table = qualified_name("web.events")
    spark.sql(f"ALTER TABLE {table} RENAME COLUMN kind TO category")
    spark.sql(f"ALTER TABLE {table} RENAME COLUMN meta.x TO size")
    spark.sql(f"ALTER TABLE {table} ADD COLUMN meta.x string")
    commit_table(spark, lake, "web.events", "test")
    assert list(_columns(lake)) == ["id", "category", "meta"]
    assert _duck_rows(lake, "id, category, meta.size, meta.y, meta.x") == [
        (1, "a", 1, "p", None),
        (2, "b", 2, "q", None),
    ]

    # Staged with `category`; the operator drops it: the batch commits without it.
    stage({"id": 3, "category": "c"})
    spark.sql(f"ALTER TABLE {qualified_name('web.events')} DROP COLUMN category")
    commit_table(spark, lake, "web.events", "test")
    assert _duck_rows(lake, "id") == [(1,), (2,), (3,)]
    assert list(_columns(lake)) == ["id", "meta"]


def test_fields_of_structs_in_lists_and_maps_an_operator_renames_or_adds_while_a_batch_is_staged_keep_their_values(
    lakehouse_home, tmp_path, monkeypatch, paths
):
    columns = [
        {"name": "id", "type": "long", "required": True},
        {"name": "items", "type": "list<struct<qty: int, sku: string>>"},
        {"name": "prices", "type": "map<string, struct<amount: double>>"},
    ]
    write_config(tmp_path, {"streams": [{**EVOLVING, "schema": {"columns": columns}}]}, monkeypatch)
    config = load_config()
    lake = Lakehouse(config, paths)
    spark = lakehouse_session(lake)
    stream = config.stream("events")
    event = {"id": 1, "items": [{"qty": 2, "sku": "a"}, None], "prices": {"a": {"amount": 1.5}, "b": None}}
    land_events(paths, stream, [json.dumps(event)])
    batch, _ = mint_next_batch(lake, stream, drain=True)
    stage_batch(spark, lake, stream, batch.sequence)
    # Staged under `qty` and `amount`; before it commits the operator renames both in Spark SQL
    # and adds a field to the list's structs.
    table = qualified_name("web.events")
    spark.sql(f"ALTER TABLE {table} RENAME COLUMN items.element.qty TO quantity")
    spark.sql(f"ALTER TABLE {table} RENAME COLUMN prices.value.amount TO price")
    spark.sql(f"ALTER TABLE {table} ADD COLUMN items.element.note string")
    commit_table(spark, lake, "web.events", "test")

    assert _columns(lake)["items"] == "list<struct<quantity: int, sku: string, note: string>>"
    assert _duck_rows(lake, "id, items, prices") == [
        (1, [{"quantity": 2, "sku": "a", "note": None}, None], {"a": {"price": 1.5}, "b": None}),
    ]


def test_a_required_column_the_events_stop_carrying_becomes_optional_with_relax_required(
    lakehouse_home, tmp_path, monkeypatch, paths, instance
):
    columns = [{"name": "id", "type": "long", "required": True}, {"name": "amount", "type": "double", "required": True}]
    relaxing = {
        **EVOLVING,
        "identifier_columns": ["id"],
        "operation": "update",
        "schema_evolution": {"relax_required": True},
        "schema": {"columns": columns},
    }
    write_config(tmp_path, {"streams": [relaxing]}, monkeypatch)
    config = load_config()
    lake = Lakehouse(config, paths)
    stream = config.stream("events")
    land_events(paths, stream, [json.dumps({"id": 1, "amount": 2.5})])
    assert run_until_idle(build_definitions(config), instance, log=lambda _: None).failed == []

    # The producer stops sending `amount`; an event without the identifier column is still a dead letter.
    land_events(paths, stream, [json.dumps({"id": 2}), json.dumps({"amount": 1.0})])
    assert run_until_idle(build_definitions(config), instance, log=lambda _: None).failed == []

    fields = {field.name: field.required for field in lake.table("web.events").schema().fields}
    assert fields == {"id": True, "amount": False}
    assert _duck_rows(lake, "id, amount") == [(1, 2.5), (2, None)]
    assert _duck_rows(lake, "reason", "web.events_dead_letters") == [("missing identifier column 'id'",)]
    summary = lake.table("web.events").current_snapshot().summary.additional_properties
    assert json.loads(summary[summary_keys.SCHEMA_CHANGE]) == {"amount": "optional double"}
    key = names.table_key("web.events")
    check = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(key, names.SCHEMA_CHECK))
    assert check.status.value == "SUCCEEDED"


def test_a_field_first_seen_only_as_null_waits_for_a_value_instead_of_becoming_a_string(
    lakehouse_home, tmp_path, monkeypatch, paths, instance
):
    inferred = {key: value for key, value in EVOLVING.items() if key != "schema"}
    write_config(tmp_path, {"streams": [inferred]}, monkeypatch)
    config = load_config()
    lake = Lakehouse(config, paths)
    stream = config.stream("events")
    land_events(paths, stream, [json.dumps({"id": 1, "count": None, "meta": {"a": None, "b": "x"}, "gone": None})])
    assert run_until_idle(build_definitions(config), instance, log=lambda _: None).failed == []
    # Inferred from the first batch: no column, and no struct field, for what was only ever null.
    assert _columns(lake) == {"id": "long", "meta": "struct<b: string>"}

    land_events(paths, stream, [json.dumps({"id": 2, "count": 5, "meta": {"a": 3000000000, "b": "y"}})])
    assert run_until_idle(build_definitions(config), instance, log=lambda _: None).failed == []

    assert _columns(lake) == {"id": "long", "meta": "struct<b: string, a: long>", "count": "long"}
    assert _rows(lake, "id", "count") == [(1, None), (2, 5)]
