"""Fixtures: a temporary LAKEHOUSE_HOME, config and DAGSTER_HOME per test; Spark shared per process."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
import pytest
import yaml

from lakehouse_assets.config.loader import load_config
from lakehouse_assets.config.spec import LakehouseConfig
from lakehouse_assets.jvm.connectors import (
    ICEBERG_AWS,
    KAFKA_BROKER,
    REST_CATALOG_SERVER,
    S3_COMPATIBLE_ENV,
    S3_SERVER,
    SPARK_KAFKA,
    connector_jars,
    fetch_jars,
)
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.ops.jvm_server import JvmServer
from lakehouse_assets.ops.kafka_broker import LocalBroker, local_broker
from lakehouse_assets.ops.s3_server import LocalS3Server, local_s3_server
from lakehouse_assets.paths import LakehousePaths
from lakehouse_assets_tests.class_data_archive import ARCHIVE_OPTION, build_archive
from lakehouse_assets_tests.postgres_server import (
    TEST_JVM_CLASS_PATH_ENV,
    PostgresServer,
    jdbc_driver_class_path,
    postgres_server,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Tests start many short-lived JVMs (cold pipeline processes, often killed; Spark hosts; servers)
# for small jobs: with the JIT's first tier only, and the serial collector, they start faster and
# leave the two cores to the work instead of the optimizing compiler. Set for the whole session, so
# every JVM a test starts, in this process or in a child, runs with them; a developer's own setting
# wins.
JAVA_OPTIONS_ENV = "JAVA_TOOL_OPTIONS"
SPARK_SCRATCH_ENV = "SPARK_LOCAL_DIRS"
# The tests' batches are tens of rows: generating Java for every plan and expression and compiling
# it costs more than it saves there. Spark evaluates them interpreted instead (its own test suites
# run both ways and hold them equal), set as system properties, which every SparkConf reads: about
# a tenth less CPU for a round (docs/benchmarks.md). The hostile-input property tests and the demo
# run generated code, as users do (``generate_code``).
INTERPRETED_SPARK = {"spark.sql.codegen.factoryMode": "NO_CODEGEN", "spark.sql.codegen.wholeStage": "false"}
GENERATED_SPARK = {"spark.sql.codegen.factoryMode": "FALLBACK", "spark.sql.codegen.wholeStage": "true"}
JIT_AND_COLLECTOR = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SUITE_JAVA_OPTIONS = " ".join([JIT_AND_COLLECTOR, *(f"-D{key}={value}" for key, value in INTERPRETED_SPARK.items())])
os.environ.setdefault(JAVA_OPTIONS_ENV, SUITE_JAVA_OPTIONS)
# A test process's own JVM has PostgreSQL's JDBC driver (at the end of its class path), so the JDBC
# catalog tests run their rounds on it, warm, as the other fault tests do. The ``lakehouse``
# processes a test starts are not given it (``fault_injection.pipeline.process_env``): there the
# driver comes from the config's ``spark.jars``, as a user's does.
if (jdbc_driver := jdbc_driver_class_path()) is not None:
    os.environ.setdefault(TEST_JVM_CLASS_PATH_ENV, jdbc_driver)


def generate_code(session: SparkSession) -> SparkSession:
    """``session`` with Spark's defaults, generated code for its plans and expressions, instead of
    the suite's interpreted evaluation (``INTERPRETED_SPARK``)."""
    for key, value in GENERATED_SPARK.items():
        session.conf.set(key, value)
    return session


def pytest_configure(config: pytest.Config) -> None:
    """Before the workers start: when Spark tests are selected and the JVM options are the suite's,
    give every Spark process of the session one scratch directory, removed at the end (a JVM the
    tests kill leaves its scratch behind: 45 MB, the copy of the Iceberg runtime jar each driver
    makes), and build the class-data-sharing archive every JVM of the session then starts from."""
    if hasattr(config, "workerinput") or "not spark" in config.option.markexpr:
        return
    # The object-store tests' pipelines run on the test JVMs as the other fault tests' do, and a JVM
    # is started for whichever configuration comes first: every one of the session gets the AWS SDK
    # that Iceberg's S3FileIO calls (one jar, read only when a class of it is loaded) at the end of
    # its class path, and the SDK's setting for a store other than AWS
    # (``jvm.connectors.S3_COMPATIBLE_ENV``) from the environment.
    class_path = [os.environ.get(TEST_JVM_CLASS_PATH_ENV, ""), *connector_jars(ICEBERG_AWS)]
    os.environ[TEST_JVM_CLASS_PATH_ENV] = os.pathsep.join(filter(None, class_path))
    for name, value in S3_COMPATIBLE_ENV.items():
        os.environ.setdefault(name, value)
    wait_for_archive = _start_archive(config) if os.environ[JAVA_OPTIONS_ENV] == SUITE_JAVA_OPTIONS else None
    # Fetched while the archive builds, before the first test (Maven is needed: a machine without
    # it fails the run here), one set at a time (Maven's local repository is not safe for two at
    # once): the Kafka broker's jars and Spark's Kafka source, which a test JVM started for another
    # configuration adds when a Kafka test's session needs it (``engine/spark.py``; on every test
    # JVM's class path instead, they made the fault tests' processes about half as slow again), and
    # the object-store tests' servers. On a machine whose Maven repository is empty, as CI's, the
    # fetches take some 35 s, mostly downloads, and the build about 25 s (``docs/benchmarks.md``).
    try:
        for name in (KAFKA_BROKER, SPARK_KAFKA, S3_SERVER, REST_CATALOG_SERVER):
            fetch_jars(name)
    finally:
        if wait_for_archive is not None:
            wait_for_archive()


def _start_archive(config: pytest.Config) -> Callable[[], None]:
    """Start building the class-data archive on a thread; returns the wait for it (which raises
    what the build raised), after which every JVM of the session starts from the archive
    (``JAVA_TOOL_OPTIONS``) if it was built. The session's Spark processes share one scratch
    directory, removed at the end."""
    directory = Path(tempfile.mkdtemp(prefix="lakehouse-test-jvm-"))
    config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
    (directory / "spark-local").mkdir()
    os.environ.setdefault(SPARK_SCRATCH_ENV, str(directory / "spark-local"))
    archive = directory / "classes.jsa"
    builder = ThreadPoolExecutor(1, thread_name_prefix="class-data-archive")
    building = builder.submit(build_archive, archive)
    builder.shutdown(wait=False)

    def wait() -> None:
        if building.result():
            os.environ[JAVA_OPTIONS_ENV] = f"{SUITE_JAVA_OPTIONS} {ARCHIVE_OPTION}{archive}"

    return wait


# The files whose tests take longest together, longest first (summed durations of a fresh-clone
# run, ``docs/benchmarks.md``). They start first: ``--dist loadfile`` hands each worker whole files
# in collection order, and a long file handed out last would keep one worker busy while the other
# idles. The other files follow in their usual order.
LONGEST_FILES = (
    "fault_injection/test_jdbc_catalog.py",
    "test_routing.py",
    "fault_injection/test_chaos.py",
    "fault_injection/test_faults.py",
    "fault_injection/test_object_store.py",
    "test_iceberg_source.py",
    "test_spark_host.py",
    "test_hostile_input.py",
    "fault_injection/test_row_deltas.py",
    "fault_injection/test_maintenance_faults.py",
    "fault_injection/test_operator_mistakes.py",
    "test_changes.py",
    "fault_injection/test_audit_faults.py",
    "test_http_source.py",
    "test_kafka.py",
)
TESTS_ROOT = Path(__file__).resolve().parent
OBJECT_STORE_BUCKET = "lake"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the tests of ``LONGEST_FILES`` first, in that order (a stable sort keeps the rest's)."""
    rank = {TESTS_ROOT / name: position for position, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))


ORDERS_STREAM = {
    "name": "orders",
    "source": {"landing": {}},
    "table_identifier": "sales.orders",
    "auto_create": True,
    "schema": {
        "columns": [
            {"name": "order_id", "type": "long", "required": True},
            {"name": "customer_id", "type": "long"},
            {"name": "amount", "type": "double"},
            {"name": "ts", "type": "timestamptz"},
        ],
        "partition_spec": [{"column": "ts", "transform": "day"}],
    },
    "table_properties": {"format-version": "2"},
    "flush": {"max_bytes": 1_000_000, "max_age": "60s"},
    "commit_interval": "0s",
}


def order_event(order_id: int, **overrides: object) -> str:
    event = {
        "order_id": order_id,
        "customer_id": order_id % 13,
        "amount": order_id * 1.25,
        "ts": f"2026-11-{1 + order_id % 20:02d}T12:00:00Z",
    }
    event.update(overrides)
    return json.dumps(event)


@pytest.fixture(scope="session")
def dagster_home_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``DAGSTER_HOME`` whose storage Dagster has created: its SQLite databases, their schemas and
    migration stamps. A test's home starts as a copy of it, 0.05 CPU-seconds where Dagster's
    creating them takes 0.22, in each of the 142 tests with this home (``docs/benchmarks.md``);
    Dagster opens the copy as it opens any instance it created before."""
    template = tmp_path_factory.mktemp("dagster-home")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("DAGSTER_HOME", str(template))
        with dg.DagsterInstance.get():
            pass
    return template


@pytest.fixture
def lakehouse_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dagster_home_template: Path) -> Path:
    home = tmp_path / "lakehouse"
    monkeypatch.setenv("LAKEHOUSE_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    shutil.copytree(dagster_home_template, tmp_path / "dagster")
    write_config(tmp_path, {"catalog": {"type": "hadoop"}, "streams": [ORDERS_STREAM]}, monkeypatch)
    return home


def write_config(directory: Path, document: dict, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Write ``document`` as the test's config. Sensors ticked as the daemon ticks them start no
    Spark host (it would outlive the test by its idle timeout) unless the document says so, as
    ``test_spark_host.py`` does."""
    path = directory / "lakehouse.yaml"
    path.write_text(yaml.safe_dump({"spark_host": {"start_early": False}, **document}))
    monkeypatch.setenv("LAKEHOUSE_CONFIG", str(path))
    return path


@pytest.fixture
def config(lakehouse_home: Path) -> LakehouseConfig:
    return load_config()


@pytest.fixture
def paths(lakehouse_home: Path) -> LakehousePaths:
    return LakehousePaths.from_env()


@pytest.fixture
def lake(lakehouse_home: Path) -> Lakehouse:
    return Lakehouse.from_env()


@pytest.fixture
def instance(lakehouse_home: Path) -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.get() as dagster_instance:
        yield dagster_instance


def fail_python_workers(spark: SparkSession, monkeypatch: pytest.MonkeyPatch, missing: Path) -> None:
    """Make every Python worker ``spark`` starts from now on fail to start (its executable is the
    path ``missing``, which does not exist): a step that needs one fails its Spark job. The
    pipeline needs none (``engine.local_rows``), so a machine whose ``python3`` is not the
    driver's Python runs it alike."""
    monkeypatch.setattr(spark.sparkContext, "pythonExec", str(missing))


def kill_session_server(server: JvmServer) -> None:
    """Kill a test server (the broker, the store, the REST catalog) when its fixture ends, instead
    of stopping it: its data is thrown away with it, and at the end of whole suites some
    took the 20 s a clean stop may before they were killed (``docs/benchmarks.md``)."""
    server.stop(kill=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server for the tests that need a real catalog database."""
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="module")
def kafka_broker() -> Iterator[LocalBroker]:
    """A local Kafka broker (KRaft, one node) from the jars Maven fetches; a machine without Maven
    or Java fails the tests that need it, never skips them. One per test file that uses it, killed
    when the file ends: idle, a broker still takes 2.4 % of a core (its heartbeats and log
    cleaner), which the rest of a suite run would otherwise pay for."""
    directory = Path(tempfile.mkdtemp(prefix="lakehouse-test-kafka-"))
    try:
        with local_broker(directory) as broker:
            yield broker
            kill_session_server(broker)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[LocalS3Server]:
    """A local S3-compatible store (S3Proxy) from the jars Maven fetches, with the bucket
    ``OBJECT_STORE_BUCKET``; like the broker, a machine that cannot run it fails its tests."""
    directory = Path(tempfile.mkdtemp(prefix="lakehouse-test-s3-"))
    try:
        with local_s3_server(directory) as server:
            server.create_bucket(OBJECT_STORE_BUCKET)
            yield server
            kill_session_server(server)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def unit_tier_starts_no_jvm(request: pytest.FixtureRequest) -> Iterator[None]:
    """The unit tier (``-m "not spark"``, ``make unit``) needs no JVM: an error after its last test
    if one of its tests started one (a fixture's error reaches the run's result under xdist too)."""
    yield
    if "not spark" not in request.config.option.markexpr or "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    assert SparkContext._gateway is None, "a test outside the spark marker started a JVM"


@pytest.fixture(autouse=True)
def no_spark_host_outlives_its_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Stop the Spark hosts that a test's runs started for its home (a job executed in-process with
    the definitions' resources calls the host), as ``lakehouse spark-host stop`` does but without
    waiting: they would otherwise idle with their JVMs for ``spark_host.idle_timeout`` after the
    test. A host the test killed leaves only its socket file, which is removed. Torn down before
    ``monkeypatch``, so the test's ``LAKEHOUSE_HOME`` and ``LAKEHOUSE_CONFIG`` are still set."""
    yield
    if not (os.environ.get("LAKEHOUSE_HOME") and os.environ.get("LAKEHOUSE_CONFIG")):
        return
    from lakehouse_assets.engine.spark_host import host_address, stop_hosts

    try:
        lake = Lakehouse.from_env()
    except Exception:  # noqa: BLE001 - a test's home or configuration may be gone or invalid
        return
    if not stop_hosts(lake, wait_seconds=0):
        Path(host_address(lake)).unlink(missing_ok=True)
