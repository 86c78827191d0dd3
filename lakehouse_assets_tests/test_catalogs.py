"""One catalog configuration mapped to Spark's and PyIceberg's clients, secrets from the environment."""

import contextlib
import os
import socket
import sys
import threading
import time

import pytest
import requests

from lakehouse_assets.catalog.catalogs import (
    REST_CLIENT,
    pyiceberg_catalog_properties,
    spark_catalog_properties,
    without_credentials,
)
from lakehouse_assets.catalog.table_metadata import catalog_client
from lakehouse_assets.config.spec import parse_config
from lakehouse_assets.engine.spark import MASTER_ENV, SPAWN_DIRECTLY, catalog_conf, static_spark_conf
from lakehouse_assets.errors import ConfigError
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.paths import LakehousePaths

STREAMS = [{"name": "s", "table_identifier": "a.b", "schema": {"columns": [{"name": "x", "type": "long"}]}}]
JDBC = {
    "type": "jdbc",
    "uri": "jdbc:postgresql://db.internal:5433/iceberg?ssl=true",
    "jdbc.user": "lake writer",
    "jdbc.password": "${env:CATALOG_PASSWORD}",
    "jdbc.sslmode": "require",
    "warehouse": "s3://bucket/warehouse",
}


def _config(catalog: dict, spark: dict | None = None):
    return parse_config({"catalog": catalog, "spark": spark or {}, "streams": STREAMS})


def test_jdbc_is_pyiceberg_sql_with_the_matching_sqlalchemy_url(monkeypatch):
    monkeypatch.setenv("CATALOG_PASSWORD", "p@ss/word")

    properties = pyiceberg_catalog_properties(JDBC)

    assert properties["type"] == "sql"
    assert properties["uri"] == (
        "postgresql+psycopg2://lake%20writer:p%40ss%2Fword@db.internal:5433/iceberg?ssl=true&sslmode=require"
    )
    assert properties["warehouse"] == "s3://bucket/warehouse"
    assert not any(key.startswith("jdbc.") for key in properties)


def test_spark_gets_iceberg_s_own_keys_with_secrets_resolved(monkeypatch):
    monkeypatch.setenv("CATALOG_PASSWORD", "secret")

    properties = spark_catalog_properties(JDBC)

    assert properties["type"] == "jdbc"
    assert properties["uri"] == JDBC["uri"]
    assert properties["jdbc.password"] == "secret"


def test_a_missing_secret_names_the_key_and_the_variable(monkeypatch):
    monkeypatch.delenv("CATALOG_PASSWORD", raising=False)

    with pytest.raises(ConfigError, match="jdbc.password.*CATALOG_PASSWORD"):
        spark_catalog_properties(JDBC)


@pytest.mark.parametrize(
    ("catalog", "kind"),
    [
        ({"type": "rest", "uri": "https://catalog.example/api", "credential": "id:secret"}, "rest"),
        ({"type": "hive", "uri": "thrift://metastore:9083"}, "hive"),
        ({"type": "glue", "warehouse": "s3://bucket/w"}, "glue"),
        ({"catalog-impl": "org.apache.iceberg.rest.RESTCatalog", "uri": "https://catalog.example"}, "rest"),
    ],
)
def test_rest_hive_glue_and_catalog_impl_pass_through(catalog, kind):
    properties = pyiceberg_catalog_properties(catalog)

    if kind == "rest":  # PyIceberg's REST client with timeouts, named by class (then no type)
        assert properties.pop("py-catalog-impl") == REST_CLIENT
        assert "type" not in properties
    else:
        assert properties.pop("type") == kind
    assert "catalog-impl" not in properties
    assert properties.items() <= catalog.items()


def test_a_rest_catalog_that_never_answers_times_out_instead_of_holding_the_caller():
    """A server that accepts the connection but never answers (a hung catalog): PyIceberg's own
    client would wait for ever; the project's gives up after the configured socket timeout, the
    same setting Spark's REST client reads."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    held: list[socket.socket] = []

    def hold_connections() -> None:
        with contextlib.suppress(OSError):  # the listener closed at the end of the test
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=hold_connections, daemon=True).start()
    hung_catalog = {"type": "rest", "uri": f"http://127.0.0.1:{port}", "rest.client.socket-timeout-ms": "500"}
    outcome: list[BaseException | None] = []

    def ask() -> None:
        try:
            catalog_client(hung_catalog, None)
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - the test inspects it below
            outcome.append(error)

    started = time.monotonic()
    caller = threading.Thread(target=ask, daemon=True)
    caller.start()
    caller.join(timeout=30)
    listener.close()
    for connection in held:
        connection.close()

    assert not caller.is_alive(), "the client still waits for the hung catalog after 30 s"
    assert isinstance(outcome[0], requests.exceptions.Timeout), outcome
    assert time.monotonic() - started < 10
    assert held, "the server never saw the connection"


def test_a_catalog_pyiceberg_cannot_read_is_refused_by_name_when_the_config_loads():
    with pytest.raises(ConfigError, match="catalog.*nessie.*no PyIceberg client"):
        _config({"type": "nessie", "uri": "http://nessie:19120/api/v2"})


def test_a_jdbc_uri_of_another_database_is_refused_without_its_credentials():
    with pytest.raises(ConfigError, match=r"jdbc:sqlserver://\*\*\*@host") as raised:
        pyiceberg_catalog_properties({"type": "jdbc", "uri": "jdbc:sqlserver://user:pw@host/db"})
    assert "pw" not in str(raised.value)


def test_uris_are_shown_without_credentials():
    assert without_credentials("https://id:secret@catalog.example/api") == "https://***@catalog.example/api"


def test_the_warehouse_defaults_to_the_storage_root_only_where_the_catalog_needs_one(tmp_path, monkeypatch):
    monkeypatch.setenv("CATALOG_PASSWORD", "secret")
    paths = LakehousePaths(tmp_path / "home", tmp_path / "shared")
    jdbc = _config({k: v for k, v in JDBC.items() if k != "warehouse"})
    rest = _config({"type": "rest", "uri": "https://catalog.example"})

    conf = catalog_conf(Lakehouse(jdbc, paths))

    assert conf["spark.sql.catalog.lake.type"] == "jdbc"
    assert conf["spark.sql.catalog.lake.warehouse"] == str(tmp_path / "shared" / "warehouse")
    assert Lakehouse(rest, paths).warehouse is None
    assert "spark.sql.catalog.lake.warehouse" not in catalog_conf(Lakehouse(rest, paths))


def test_configured_jars_come_after_the_iceberg_runtime_on_a_cluster(monkeypatch):
    monkeypatch.setenv(MASTER_ENV, "spark://cluster:7077")
    config = _config({"type": "hadoop", "warehouse": "/w"}, spark={"spark.jars": "/usr/share/java/postgresql.jar"})

    conf = static_spark_conf(config)

    jars = conf["spark.jars"].split(",")
    assert jars[0].endswith("iceberg-spark-runtime-3.5_2.12-1.10.2.jar") and jars[1] == "/usr/share/java/postgresql.jar"
    assert "spark.driver.extraClassPath" not in conf


def test_a_local_master_puts_the_local_jars_on_the_driver_class_path():
    jars = "/usr/share/java/postgresql.jar,file:///opt/extra.jar,https://repo.example/remote.jar"
    spark = {"spark.jars": jars, "spark.driver.extraClassPath": "/opt/mine/*"}
    config = _config({"type": "hadoop", "warehouse": "/w"}, spark=spark)

    conf = static_spark_conf(config)

    class_path = conf["spark.driver.extraClassPath"].split(os.pathsep)
    assert class_path[0].endswith("iceberg-spark-runtime-3.5_2.12-1.10.2.jar")
    assert class_path[1:] == ["/usr/share/java/postgresql.jar", "/opt/extra.jar", "/opt/mine/*"]
    # What is not a file here still reaches Spark, which fetches it.
    assert conf["spark.jars"] == "https://repo.example/remote.jar"


def test_the_configs_java_options_keep_the_ones_the_engine_adds():
    config = _config({"type": "hadoop", "warehouse": "/w"}, spark={"spark.executor.extraJavaOptions": "-XX:+UseG1GC"})

    conf = static_spark_conf(config)

    added = [SPAWN_DIRECTLY] if sys.platform.startswith("linux") else []
    assert conf["spark.executor.extraJavaOptions"].split() == ["-XX:+UseG1GC", *added]
    assert conf["spark.driver.extraJavaOptions"].split()[1:] == added


@pytest.mark.spark  # the AWS SDK's jar comes from Maven, as the Spark tier's do
def test_a_warehouse_on_an_s3_compatible_store_gets_the_aws_sdk_and_its_settings(monkeypatch):
    monkeypatch.setenv("LAKE_S3_SECRET", "not-for-logs")
    catalog = {
        "type": "rest",
        "uri": "http://catalog:8181",
        "warehouse": "s3://lake/warehouse",
        "s3.endpoint": "http://store:9000",
        "s3.secret-access-key": "${env:LAKE_S3_SECRET}",
    }
    config = _config(catalog)

    conf = static_spark_conf(config)
    properties = spark_catalog_properties(config.catalog)

    assert any("iceberg-aws-bundle" in jar for jar in conf["spark.driver.extraClassPath"].split(os.pathsep))
    assert "-Daws.requestChecksumCalculation=WHEN_REQUIRED" in conf["spark.driver.extraJavaOptions"]
    assert properties["s3.secret-access-key"] == "not-for-logs"
    # Spark's REST client waits for ever without a socket timeout; the config may set its own.
    assert properties["rest.client.socket-timeout-ms"] == "120000"
    assert (
        spark_catalog_properties({**catalog, "rest.client.socket-timeout-ms": "5000"})["rest.client.socket-timeout-ms"]
        == "5000"
    )


def test_the_storage_root_is_a_mounted_path_or_file_uri(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAKEHOUSE_STORAGE_ROOT", f"file://{tmp_path}/shared")

    paths = LakehousePaths.from_env()

    assert paths.landing("orders") == tmp_path / "shared" / "landing" / "orders"
    assert paths.locks == tmp_path / "home" / "state" / "locks"
    monkeypatch.setenv("LAKEHOUSE_STORAGE_ROOT", "s3://bucket/lake")
    with pytest.raises(ConfigError, match="LAKEHOUSE_STORAGE_ROOT='s3://bucket/lake'.*mount"):
        LakehousePaths.from_env()
