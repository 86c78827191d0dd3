"""The one place that configures Spark for Iceberg: runtime jar, Java, catalog ``lake``.

Static settings (jar, SQL extensions) belong to the JVM-wide session; catalog settings belong to a
child session per lakehouse home (``newSession``), so one process can serve several homes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from importlib import resources
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from lakehouse_assets.catalog.catalogs import HADOOP, spark_catalog_properties, uses_s3
from lakehouse_assets.catalog.table_metadata import CATALOG_NAME, is_hadoop_catalog
from lakehouse_assets.config.spec import LakehouseConfig
from lakehouse_assets.jvm.connectors import ICEBERG_AWS, S3_COMPATIBLE_SDK_SETTINGS, SPARK_KAFKA, connector_jars
from lakehouse_assets.jvm.java_runtime import ensure_java_home
from lakehouse_assets.jvm.spark_jvm import jvm as spark_jvm
from lakehouse_assets.jvm.spark_jvm import resolve_names_once
from lakehouse_assets.lakehouse import Lakehouse

ICEBERG_RUNTIME_JAR = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
ICEBERG_JAR_PACKAGE = "snowpark_connect_deps_iceberg"
MASTER_ENV = "LAKEHOUSE_SPARK_MASTER"
KAFKA_SOURCE_ARTIFACT = "spark-sql-kafka-0-10"
DRIVER_MEMORY_ENV = "LAKEHOUSE_SPARK_DRIVER_MEMORY"


def iceberg_runtime_jar() -> str:
    """Path of the Iceberg Spark runtime jar shipped by the ``snowpark-connect-deps-iceberg`` package."""
    return str(resources.files(ICEBERG_JAR_PACKAGE) / "jars" / ICEBERG_RUNTIME_JAR)


# Hadoop's local file system (a ``file:`` lake, staged Parquet, Spark's scratch) sets the
# permissions of every file and directory it creates by running ``chmod``, as PySpark's jars have
# no Hadoop native library: about a hundred processes a pipeline round. Java 17 on Linux starts
# each through its spawn helper, two programs executed; ``VFORK``, Java 11's default there and
# supported by the Javas Spark 3.5 runs on (``jvm.java_runtime``), executes ``chmod`` directly:
# 1.2 ms of CPU a process instead of 2.5 (``docs/benchmarks.md``). Linux only: macOS's Java has
# no VFORK.
SPAWN_DIRECTLY = "-Djdk.lang.Process.launchMechanism=VFORK"


def _log_settings() -> str:
    return str(resources.files("lakehouse_assets.engine").joinpath("log4j2.properties"))


def static_spark_conf(config: LakehouseConfig) -> dict[str, str]:
    """JVM-wide settings: the Iceberg runtime jar, UTC, small shuffles, then the config's ``spark`` map.

    Users who reach Maven can set ``spark.jars.packages`` in the ``spark`` map instead of the
    packaged jar (and of the Kafka source's jars, which a Kafka stream otherwise brings from the
    connector cache, ``connectors.py``); ``LAKEHOUSE_SPARK_MASTER`` overrides the master for one process.
    """
    conf = {
        "spark.master": "local[2]",
        "spark.app.name": "lakehouse_assets",
        "spark.driver.memory": os.environ.get(DRIVER_MEMORY_ENV, "4g"),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # Staged Parquet keeps dates and timestamps as they are (proleptic Gregorian, as Iceberg
        # and DuckDB read them): Spark's default refuses to write one before 1582 or 1900.
        "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # The writer stages only rows whose required columns are set, so Parquet's nullable
        # columns may be appended to required Iceberg columns.
        "spark.sql.iceberg.check-nullability": "false",
        # A JSON object with a key twice, or map keys that coerce alike, keep the last value
        # instead of failing the job.
        "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
        # Warnings and errors only, without local Spark's start-up notices (log4j2.properties).
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_log_settings()}",
    }
    conf.update(config.spark)
    if MASTER_ENV in os.environ:
        conf["spark.master"] = os.environ[MASTER_ENV]
    if java_options := _added_java_options(config):
        for side in ("driver", "executor"):
            key = f"spark.{side}.extraJavaOptions"
            conf[key] = " ".join(filter(None, [conf.get(key), *java_options]))
    if "spark.jars.packages" not in config.spark:
        # The Iceberg runtime first, then the jars the config adds (a JDBC catalog's driver, say).
        jars = [iceberg_runtime_jar(), *filter(None, conf.pop("spark.jars", "").split(","))]
        if any(stream.kafka_source for stream in config.streams):
            jars += connector_jars(SPARK_KAFKA)
        if uses_s3(config.catalog):
            jars += connector_jars(ICEBERG_AWS)
        conf.update(_jar_settings(jars, conf["spark.master"], config.spark.get("spark.driver.extraClassPath")))
    return conf


def _added_java_options(config: LakehouseConfig) -> list[str]:
    """The JVM options the engine adds to the driver's and the executors' own (the config's)."""
    options = [SPAWN_DIRECTLY] if sys.platform.startswith("linux") else []
    if "s3.endpoint" in config.catalog:  # a store other than AWS
        options += [f"-D{name}={value}" for name, value in S3_COMPATIBLE_SDK_SETTINGS.items()]
    return options


def _jar_settings(jars: list[str], master: str, class_path: str | None) -> dict[str, str]:
    """Where ``jars`` go: on a cluster, ``spark.jars``, which Spark serves to the executors. On a
    local master the driver is the executor, so the jars that are files on this machine go on its
    class path instead: Spark would otherwise copy each into its scratch directory on every start
    (45 MB for the Iceberg runtime) and load them with a class loader of its own, from which a
    class-data-sharing archive cannot map them."""
    if not master.startswith("local"):
        return {"spark.jars": ",".join(jars)}
    files = {jar: path for jar in jars if (path := _local_path(jar)) is not None}
    settings = {"spark.driver.extraClassPath": os.pathsep.join(filter(None, [*files.values(), class_path]))}
    if elsewhere := [jar for jar in jars if jar not in files]:
        settings["spark.jars"] = ",".join(elsewhere)
    return settings


def _local_path(jar: str) -> str | None:
    """The path of ``jar`` when it is one file on this machine (a path or a ``file:`` URI)."""
    parsed = urlparse(jar)
    if parsed.scheme not in ("", "file") or parsed.netloc or "*" in jar:
        return None
    return parsed.path


def catalog_conf(lake: Lakehouse) -> dict[str, str]:
    """Session settings for catalog ``lake`` from the config's catalog properties, and for the own
    catalog of each Iceberg source that has one."""
    conf = _one_catalog_conf(CATALOG_NAME, lake)
    for stream in lake.config.streams:
        if stream.iceberg_source and stream.iceberg_source.catalog:
            conf |= _one_catalog_conf(stream.source_catalog_name, lake.source(stream))
    return conf


def _one_catalog_conf(name: str, lake: Lakehouse) -> dict[str, str]:
    prefix = f"spark.sql.catalog.{name}"
    conf = {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.cache-enabled": "false",
    }
    for key, value in spark_catalog_properties(lake.config.catalog).items():
        conf[f"{prefix}.{key}"] = value
    if is_hadoop_catalog(lake.config.catalog):
        conf[f"{prefix}.type"] = HADOOP
    if warehouse := lake.warehouse:
        conf[f"{prefix}.warehouse"] = warehouse
    return conf


JvmStart = Callable[[], SparkSession]
"""Makes the process's JVM-wide session with ``static_spark_conf`` (PySpark's builder's
``getOrCreate``): in a Dagster run, its dagster-pyspark resource configured with those settings."""


def _built(config: LakehouseConfig) -> JvmStart:
    def build() -> SparkSession:
        builder = SparkSession.builder
        for key, value in static_spark_conf(config).items():
            builder = builder.config(key, value)
        return builder.getOrCreate()

    return build


def jvm_session(config: LakehouseConfig, start: JvmStart | None = None) -> SparkSession:
    """The process's JVM-wide Spark session with ``static_spark_conf``, made by ``start`` (by
    default PySpark's builder); starts the JVM on first use, on the Java that runs Spark.

    Thread-safe: a second caller waits for the first one's JVM (PySpark's builder lock).
    """
    ensure_java_home()
    root = (start or _built(config))()
    root.sparkContext.setLogLevel("ERROR")
    resolve_names_once(spark_jvm(root))
    return root


def start_jvm_in_background(config: LakehouseConfig) -> threading.Thread:
    """Start this process's JVM (``jvm_session``) on a daemon thread and return it at once, so it
    starts while the caller loads Dagster; the first ``lakehouse_session`` waits for it. A start
    that fails is left to that call, which starts the JVM again and raises the error."""

    def start() -> None:
        with contextlib.suppress(Exception):
            jvm_session(config)

    starting = threading.Thread(target=start, name="lakehouse-jvm-start", daemon=True)
    starting.start()
    return starting


def _add_kafka_source(session: SparkSession, config: LakehouseConfig) -> None:
    """Give a session of a JVM started without Spark's Kafka source (for another configuration:
    a Spark host or a process serving several homes) the source's jars, when ``config`` has a Kafka
    stream. Spark SQL's ``ADD JAR`` adds them to the running JVM; it also makes them the calling
    thread's class loader, which is where Spark looks a data source up, so it runs for every
    session (a jar added before is only registered again)."""
    if not any(stream.kafka_source for stream in config.streams):
        return
    started = session.sparkContext.getConf()
    settings = ("spark.driver.extraClassPath", "spark.jars", "spark.jars.packages")
    if any(KAFKA_SOURCE_ARTIFACT in (started.get(key) or "") for key in settings):
        return
    for jar in connector_jars(SPARK_KAFKA):
        session.sql("ADD JAR '{}'".format(jar.replace("\\", "\\\\").replace("'", "\\'")))


def lakehouse_session(lake: Lakehouse, start: JvmStart | None = None) -> SparkSession:
    """A Spark session whose catalog ``lake`` is this lakehouse's; starts the JVM on first use
    (with ``start``, as ``jvm_session``)."""
    session = jvm_session(lake.config, start).newSession()
    for key, value in catalog_conf(lake).items():
        session.conf.set(key, value)
    _add_kafka_source(session, lake.config)
    # Iceberg's JVM helpers (Spark3Util, CommitMetadata) resolve catalogs through the thread's
    # active session, which Spark sets only inside its own SQL and DataFrame calls.
    spark_jvm(session).SparkSession.setActiveSession(session._jsparkSession)
    return session
