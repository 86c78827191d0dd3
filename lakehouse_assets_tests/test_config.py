import pytest

from lakehouse_assets.config.loader import load_config
from lakehouse_assets.config.routed_streams import with_routes
from lakehouse_assets.config.spec import parse_config, parse_duration
from lakehouse_assets.errors import ConfigError
from lakehouse_assets_tests.conftest import ORDERS_STREAM, write_config


def test_packaged_demo_config_is_used_without_a_file(monkeypatch, tmp_path):
    monkeypatch.delenv("LAKEHOUSE_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    config = load_config()
    stream = config.stream("orders")
    assert stream.table_identifier == "sales.orders"
    assert stream.flush.max_age == 60.0
    assert stream.commit_interval == 0.0
    assert stream.resolved_event_time_column() == "ts"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"flush": {"max_age": "5 minutes"}}, "stream 'orders': flush.max_age: invalid duration '5 minutes'"),
        ({"flsh": {}}, "stream 'orders': flsh: unknown key; did you mean 'flush'?"),
        ({"table_identifier": "orders"}, "stream 'orders': table_identifier: 'orders' is not of the form"),
        (
            {"operation": "${/op}"},
            "stream 'orders': identifier_columns: required when the stream applies changes and creates its table",
        ),
        ({"operation": "${op}"}, "stream 'orders': operation: '${op}' is not a JSON pointer expression"),
        ({"operation": "upsert"}, "stream 'orders': operation: constant operation 'upsert' is not one of"),
        (
            {"operation": "${/op}", "identifier_columns": ["customer_id"]},
            "identifier_columns: 'customer_id' must be declared with required: true",
        ),
        (
            {"operation": "${/op}", "identifier_columns": ["nope"]},
            "identifier_columns: 'nope' is not a declared column",
        ),
        ({"identifier_columns": ["order_id"]}, "identifier_columns: only used with operation or format: debezium"),
        (
            {"source": {"landing": {"format": "debezium"}}, "operation": "${/op}", "identifier_columns": ["order_id"]},
            "operation: a Debezium stream takes each event's operation from its envelope's 'op'",
        ),
        (
            {"schema": {"columns": [{"name": "a", "type": "varchar"}]}},
            "stream 'orders': schema.columns[a].type: unsupported type 'varchar'",
        ),
        (
            {"schema": {"columns": [{"name": "a", "type": "long"}], "partition_spec": [{"column": "b"}]}},
            "partition_spec names column 'b', which is not declared",
        ),
        (
            {
                "schema": {
                    "columns": [{"name": "a", "type": "long"}],
                    "partition_spec": [{"column": "a", "transform": "week"}],
                }
            },
            "unsupported transform 'week'",
        ),
        (
            {"maintenance": {"expire_snapshots": {"older_than": "2 days"}}},
            "stream 'orders': maintenance.expire_snapshots.older_than: invalid duration '2 days'",
        ),
        ({"maintenance": {"expire_snapshots": {"retain_last": 0}}}, "retain_last: Input should be greater than"),
        ({"maintenance": {"compact": {}}}, "stream 'orders': maintenance.compact: unknown key"),
        (
            {"schema": {"columns": [{"name": "a", "type": "long"}]}, "completeness": {"start_date": "2026-01-01"}},
            "completeness: needs a timestamp column",
        ),
        ({"completeness": {"start_date": "January"}}, "stream 'orders': completeness.start_date: Input should be"),
        (
            {"table_identifier": "${/source/table}"},
            "stream 'orders': schema.columns: a dynamic table_identifier routes to tables with different schemas",
        ),
        (
            {"table_identifier": "sales.${source.table}", "schema": {}},
            "table_identifier: 'sales.${source.table}' is not a table expression",
        ),
        ({"routed_from": "other"}, "stream 'orders': routed_from: set by routing, not a configuration key"),
        (
            {"source": {"landing": {}, "iceberg": {"table": "gold.orders"}}},
            "stream 'orders': source: a stream needs exactly one source",
        ),
        (
            {
                "source": {"iceberg": {"table": "gold.orders", "identifier_columns": ["order_id"]}},
                "operation": "${/op}",
            },
            "operation and identifier_columns come from source.iceberg",
        ),
        ({"source": {"iceberg": {"table": "orders"}}}, "source.iceberg.table: 'orders' is not of the form"),
        (
            {"source": {"iceberg": {"table": "gold.orders", "catalog": {"type": "hadoop"}}}},
            "source.iceberg.catalog: a hadoop catalog needs its warehouse",
        ),
        ({"publish": "staged"}, "stream 'orders': publish: Input should be 'direct' or 'audit'"),
        (
            {"expectations": [{"name": "positive", "condition": "amount > 0", "on_failure": "drop"}]},
            "stream 'orders': expectations[positive].on_failure: Input should be 'block' or 'dead_letter'",
        ),
        (
            {"expectations": [{"name": "p", "condition": "amount > 0"}, {"name": "p", "condition": "amount < 9"}]},
            "stream 'orders': expectations: duplicate expectation names: p",
        ),
        ({"expectations": [{"name": "amount >= 0", "condition": "amount >= 0"}]}, "expectation name 'amount >= 0'"),
        (
            {"schema": {"columns": [{"name": "a", "type": "long"}, {"name": "A", "type": "string"}]}},
            "stream 'orders': schema: duplicate column names (case is ignored): A, a",
        ),
    ],
)
def test_invalid_keys_are_named_with_their_stream(change, message):
    with pytest.raises(ConfigError) as raised:
        parse_config({"streams": [{**ORDERS_STREAM, **change}]})
    assert message in str(raised.value)


def test_table_location_needs_a_catalog_that_can_place_tables():
    with pytest.raises(ConfigError, match="streams orders: table_location: the hadoop catalog keeps each table"):
        parse_config({"streams": [{**ORDERS_STREAM, "table_location": "/data/orders"}]})
    placed = parse_config(
        {"catalog": {"type": "rest", "uri": "http://catalog"}, "streams": [{**ORDERS_STREAM, "table_location": "/d"}]}
    )
    assert placed.streams[0].table_location == "/d"


def test_duplicate_streams_and_unknown_stream_are_errors():
    with pytest.raises(ConfigError, match="duplicate stream names: orders"):
        parse_config({"streams": [ORDERS_STREAM, ORDERS_STREAM]})
    config = parse_config({"streams": [ORDERS_STREAM]})
    with pytest.raises(ConfigError, match="unknown stream 'clicks'; configured streams: orders"):
        config.stream("clicks")


def test_streams_of_one_table_must_agree_on_its_maintenance():
    clicks = {**ORDERS_STREAM, "name": "clicks", "maintenance": {"expire_snapshots": {"retain_last": 3}}}
    with pytest.raises(ConfigError, match="streams orders, clicks write sales.orders with different maintenance"):
        parse_config({"streams": [ORDERS_STREAM, clicks]})
    clicks["maintenance"] = {"landing_retention": "1d"}
    assert (
        parse_config({"streams": [ORDERS_STREAM, clicks]}).maintenance("sales.orders").expire_snapshots.retain_last
        == 10
    )


def test_missing_config_file_named_by_env_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("LAKEHOUSE_CONFIG", str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="does not name a file"):
        load_config()


def test_streams_of_one_table_must_agree_on_how_it_is_published():
    clicks = {**ORDERS_STREAM, "name": "clicks", "publish": "audit"}
    with pytest.raises(ConfigError, match="streams orders, clicks write sales.orders with different publish modes"):
        parse_config({"streams": [ORDERS_STREAM, clicks]})
    config = parse_config({"streams": [{**ORDERS_STREAM, "publish": "audit"}, clicks]})
    assert config.audits("sales.orders")


@pytest.mark.parametrize(("text", "seconds"), [("0s", 0), ("250ms", 0.25), ("5m", 300), ("1h", 3600), (30, 30)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_change_streams_accept_operation_pointers_constants_and_debezium():
    pointer = parse_config(
        {"streams": [{**ORDERS_STREAM, "operation": "${/meta/op}", "identifier_columns": ["order_id"]}]}
    )
    assert pointer.stream("orders").applies_changes
    constant = parse_config({"streams": [{**ORDERS_STREAM, "operation": "Delete", "identifier_columns": ["order_id"]}]})
    assert constant.stream("orders").operation == "Delete"
    debezium = {**ORDERS_STREAM, "source": {"landing": {"format": "debezium"}}, "identifier_columns": ["order_id"]}
    assert parse_config({"streams": [debezium]}).stream("orders").is_debezium
    existing_table = {**ORDERS_STREAM, "auto_create": False, "operation": "${/op}"}
    assert parse_config({"streams": [existing_table]}).stream("orders").identifier_columns is None


def test_each_routed_table_becomes_a_stream_with_the_routers_settings(tmp_path):
    router = {**ORDERS_STREAM, "name": "events", "table_identifier": "${/db}.${/table}", "schema": {}}
    config = parse_config({"streams": [router]})
    assert config.tables == {} and [stream.name for stream in config.routers()] == ["events"]
    (tmp_path / "events" / "shop.orders").mkdir(parents=True)

    routed = with_routes(config, tmp_path)

    stream = routed.stream("events__shop__orders")
    assert (stream.table_identifier, stream.routed_from, stream.flush) == (
        "shop.orders",
        "events",
        config.streams[0].flush,
    )
    assert stream.source.landing.path == str(tmp_path / "events" / "shop.orders")
    assert list(routed.tables) == ["shop.orders"]


def test_an_iceberg_source_with_a_key_applies_its_changes_by_that_key():
    source = {"iceberg": {"table": "gold.orders", "identifier_columns": ["order_id"], "polling_interval": "5s"}}
    stream = parse_config({"streams": [{**ORDERS_STREAM, "source": source}]}).streams[0]
    assert (stream.operation, stream.identifier_columns) == ("${/bulk_action}", ["order_id"])
    assert stream.applies_changes and stream.iceberg_source.polling_interval == 5.0


def test_a_routes_directory_no_router_could_write_does_not_break_loading(lakehouse_home, tmp_path, monkeypatch):
    router = {"name": "app", "table_identifier": "${/db}.${/t}", "auto_create": True}
    write_config(tmp_path, {"streams": [router]}, monkeypatch)
    for name in ("shop.orders", "shop.orders\n", "Shop.Upper", "a..b", "x.y__z", "only"):
        (lakehouse_home / "routes" / "app" / name).mkdir(parents=True)

    config = load_config()

    assert sorted(stream.name for stream in config.streams) == ["app", "app__shop__orders"]


def _kafka_stream(**source: object) -> dict:
    return {
        "name": "ticks",
        "table_identifier": "market.ticks",
        "source": {"kafka": {"bootstrap_servers": "127.0.0.1:9092", **source}},
    }


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({}, "set exactly one of topic and topic_pattern"),
        ({"topic": "a", "topic_pattern": "a.*"}, "set exactly one of topic and topic_pattern"),
        ({"topic": "bad/topic"}, "is not a Kafka topic name"),
        ({"topic_pattern": "(unclosed"}, "topic_pattern '(unclosed'"),
        ({"topic": "t", "metadata_columns": {"k": "lsn"}}, "'lsn' is not one of topic, partition"),
        ({"topic": "t", "security": {"protocol": "SASL_SSL"}}, "needs sasl_mechanism, sasl_username and sasl_password"),
        ({"topic": "t", "max_records": 0}, "source.kafka.max_records"),
    ],
)
def test_a_bad_kafka_source_names_the_stream_and_the_key(source, message):
    with pytest.raises(ConfigError) as raised:
        parse_config({"streams": [_kafka_stream(**source)]})
    assert "stream 'ticks'" in str(raised.value)
    assert message in str(raised.value)


def test_kafka_secrets_come_from_the_environment_and_reach_both_clients(monkeypatch):
    from lakehouse_assets.source.kafka_log import client_settings, spark_options

    monkeypatch.setenv("KAFKA_SECRET", 'pa"ss')
    security = {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "svc"}
    config = parse_config(
        {"streams": [_kafka_stream(topic="t", security={**security, "sasl_password": "${env:KAFKA_SECRET}"})]}
    )
    stream = config.streams[0]
    assert 'pa"ss' not in repr(config)  # the configuration holds the reference, not the secret
    assert client_settings(stream)["sasl.password"] == 'pa"ss'
    jaas = spark_options(stream)["kafka.sasl.jaas.config"]
    assert jaas == 'org.apache.kafka.common.security.scram.ScramLoginModule required username="svc" password="pa\\"ss";'
    assert spark_options(stream)["kafka.isolation.level"] == "read_committed"
