"""The pipeline with its warehouse on an S3-compatible store and its tables in an Iceberg REST
catalog: real servers on loopback (S3Proxy, Iceberg's own ``RESTCatalogServer``), Spark writing
through Iceberg's S3FileIO, DuckDB and PyIceberg reading the objects back. Exactly once through a
crash at the commit points, from two hosts that share only the catalog and the store, and across
the store itself killed mid-commit.

The first round runs once per session; each test starts from a copy of its local files and the
first round's tables registered again in the catalog, on the same store (objects a test wrote are
unreferenced for the next one).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pyarrow import fs
from pyiceberg.catalog import Catalog, load_catalog

from lakehouse_assets import faults
from lakehouse_assets.cli.demo import run_demo
from lakehouse_assets.cli.object_store_demo import KEY_ID_ENV, demo_environment, write_environment
from lakehouse_assets.cli.object_store_demo import SECRET_ENV as DEMO_SECRET_ENV
from lakehouse_assets.commit.key_index import MANIFEST
from lakehouse_assets.config.loader import CONFIG_ENV
from lakehouse_assets.jvm.connectors import S3_COMPATIBLE_ENV
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.ops.rest_catalog_server import LocalRestCatalog
from lakehouse_assets.ops.s3_server import LocalS3Server
from lakehouse_assets.paths import STORAGE_ROOT_ENV, LakehousePaths
from lakehouse_assets_tests.conftest import OBJECT_STORE_BUCKET, kill_session_server
from lakehouse_assets_tests.fault_injection.faulty_store import FaultyStoreProxy
from lakehouse_assets_tests.fault_injection.invariants import (
    FAULT_PIPELINE_TABLES,
    assert_every_batch_once,
    invariant_violations,
)
from lakehouse_assets_tests.fault_injection.pipeline import (
    PIPELINE,
    assert_publish_refused,
    kill_at_then_restart,
    lakehouse_paused_at,
    land_round,
    run_lakehouse,
    run_pipeline,
    start_paused_at,
)
from lakehouse_assets_tests.fault_injection.template_homes import restored_home, use_home

pytestmark = pytest.mark.spark

TABLES = FAULT_PIPELINE_TABLES
CUSTOMERS = "crm.customers"
SECRET_ENV = "LAKEHOUSE_TEST_S3_SECRET"
STORE_DOWN_SECONDS = 8


def object_store_pipeline(catalog: LocalRestCatalog) -> dict:
    """The fault pipeline on ``catalog``, its store's secret key read from the environment."""
    properties = catalog.catalog_properties() | {"s3.secret-access-key": f"${{env:{SECRET_ENV}}}"}
    return {"catalog": properties, **PIPELINE}


def _tables(catalog: LocalRestCatalog) -> tuple[Catalog, dict[str, str]]:
    """A PyIceberg client of ``catalog`` and each of its tables' metadata location."""
    client = load_catalog("fixture", **catalog.catalog_properties())
    tables = {
        ".".join(identifier): client.load_table(identifier).metadata_location
        for namespace in client.list_namespaces()
        for identifier in client.list_tables(namespace)
    }
    return client, tables


@pytest.fixture(scope="session")
def object_store_first_round(
    tmp_path_factory: pytest.TempPathFactory, s3_server: LocalS3Server
) -> Iterator[tuple[Path, LocalRestCatalog, dict[str, str]]]:
    """The first round committed on a REST catalog of its own (a warehouse prefix of its own on
    the session's store), with its tables' metadata locations and a template of the local files."""
    base = tmp_path_factory.mktemp("object-store-pipeline")
    warehouse = f"s3://{OBJECT_STORE_BUCKET}/{uuid.uuid4().hex[:8]}/warehouse"
    catalog = LocalRestCatalog.at(base / "rest", s3_server, warehouse)
    catalog.start()
    work = base / "work"
    (work / "dagster").mkdir(parents=True)
    (work / "lakehouse.yaml").write_text(yaml.safe_dump(object_store_pipeline(catalog)))
    try:
        with pytest.MonkeyPatch.context() as monkeypatch:
            use_home(work, monkeypatch)
            monkeypatch.setenv(SECRET_ENV, s3_server.secret_access_key)
            lake = Lakehouse.from_env()
            land_round(lake, 0)
            completed = run_pipeline()
            assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
            assert invariant_violations(lake) == []
        shutil.copytree(work, base / "template")
        yield base, catalog, _tables(catalog)[1]
    finally:
        kill_session_server(catalog)


@pytest.fixture
def rest_catalog(
    object_store_first_round: tuple[Path, LocalRestCatalog, dict[str, str]],
) -> LocalRestCatalog:
    """The REST catalog with the first round's tables: what a test committed is dropped from the
    catalog (its objects stay, unreferenced) and the first round's metadata registered again."""
    _, catalog, first_round = object_store_first_round
    client, tables = _tables(catalog)
    for identifier in tables:
        client.drop_table(identifier)
    for identifier, metadata_location in first_round.items():
        client.register_table(identifier, metadata_location)
    return catalog


@pytest.fixture
def lakehouse_home(
    object_store_first_round: tuple[Path, LocalRestCatalog, dict[str, str]],
    rest_catalog: LocalRestCatalog,
    s3_server: LocalS3Server,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """The object-store pipeline's local files with the first round committed."""
    home = restored_home(object_store_first_round[0], monkeypatch)
    monkeypatch.setenv(SECRET_ENV, s3_server.secret_access_key)
    return home


def test_the_pipeline_commits_to_the_object_store_exactly_once_and_keeps_its_secret(lake, s3_server):
    land_round(lake, 1)

    completed = run_pipeline()

    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert_every_batch_once(lake)
    for identifier in TABLES:
        assert lake.metadata_location(identifier).startswith(f"s3://{OBJECT_STORE_BUCKET}/"), identifier
    # The change table's batch committed as a row delta (its position deletes written to the
    # store), not a MERGE: the row delta itself brought the key index to the table's new head (a
    # commit recorded on it; a rebuild records none).
    customers = lake.require_table(CUSTOMERS).current_snapshot()
    assert int(customers.summary.additional_properties["added-position-deletes"]) > 0
    index = json.loads((lake.paths.key_index(CUSTOMERS) / MANIFEST).read_text())
    assert (index["snapshot_id"], index["unfolded_commits"] > 0) == (customers.snapshot_id, True)
    # Nothing of the tables is on the local disk, and the store's secret key is in no local file
    # (the homes: staged batches, state, Dagster's runs and their logs).
    assert not lake.paths.warehouse.exists()
    secret = s3_server.secret_access_key.encode()
    homes = (lake.paths.home, Path(os.environ["DAGSTER_HOME"]))
    files = [path for home in homes for path in home.rglob("*") if path.is_file()]
    assert files and [path for path in files if secret in path.read_bytes()] == []
    assert s3_server.secret_access_key not in completed.stdout + completed.stderr


# What a change batch's row delta does after its commit, in a process of its own: read the rows it
# added back through PyIceberg's FileIO (PyArrow's S3 client), whose positions go into the key index.
READ_A_DATA_FILE = f"""
import pyarrow.parquet as pq
from lakehouse_assets.lakehouse import Lakehouse
table = Lakehouse.from_env().require_table({CUSTOMERS!r})
location = next(iter(table.scan().plan_files())).file.file_path
with table.io.new_input(location).open() as data_file:
    print(pq.read_table(data_file).num_rows)
"""


def test_a_process_reads_data_files_from_an_s3_compatible_store_with_no_sdk_settings_of_its_own(lake):
    # The suite's environment carries the AWS SDK's settings for a store other than AWS (for the
    # test JVMs); a user's process does not: the lakehouse must set them itself, or S3Proxy refuses
    # PyArrow's ranged reads (501) and the key index never follows a row delta's commit.
    environment = {name: value for name, value in os.environ.items() if name not in S3_COMPATIBLE_ENV}

    completed = subprocess.run(
        [sys.executable, "-c", READ_A_DATA_FILE], env=environment, capture_output=True, text=True, timeout=300
    )

    assert completed.returncode == 0, completed.stderr[-3000:]
    assert int(completed.stdout.split()[-1]) > 0


@pytest.mark.parametrize("point", [faults.DEAD_LETTERS_AFTER_WRITE, faults.COMMITTER_BEFORE_PUBLISH])
def test_a_pipeline_killed_at_a_commit_point_recovers_exactly_once_on_the_object_store(point, lake):
    land_round(lake, 1)

    kill_at_then_restart(point)

    assert_every_batch_once(lake)


def _delete_objects(store: fs.S3FileSystem, prefix: str) -> set[str]:
    """The position-delete files under ``prefix`` on the store, as ``bucket/key``."""
    listed = store.get_file_info(fs.FileSelector(prefix, recursive=True, allow_not_found=True))
    return {info.path for info in listed if info.path.endswith("-deletes.parquet")}


def test_a_row_delta_killed_with_its_delete_files_on_the_store_recovers_exactly_once(lake, s3_server):
    land_round(lake, 1)
    store = s3_server.file_system()
    data_prefix = f"{lake.require_table(CUSTOMERS).location()}/data".removeprefix("s3://")
    earlier = _delete_objects(store, data_prefix)  # other tests' commits leave theirs too

    crashed = run_pipeline({faults.CRASH_ENV: faults.ROW_DELTA_AFTER_DELETE_FILES})
    left_behind = _delete_objects(store, data_prefix) - earlier
    restarted = run_pipeline()

    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-3000:]
    assert left_behind, "the killed row delta had written no delete file to the store"
    assert restarted.returncode == 0, restarted.stdout[-3000:] + restarted.stderr[-3000:]
    assert_every_batch_once(lake)
    # The killed attempt's delete files are objects no snapshot references: none of them applies.
    tasks = lake.require_table(CUSTOMERS).scan().plan_files()
    referenced = {delete.file_path for task in tasks for delete in task.delete_files}
    assert referenced and referenced.isdisjoint(f"s3://{key}" for key in left_behind)


def test_two_hosts_sharing_only_the_rest_catalog_and_the_store_commit_each_batch_once(lake, tmp_path):
    land_round(lake, 1)
    host_b = tmp_path / "host-b"
    (host_b / "dagster").mkdir(parents=True)
    on_host_b = {
        "LAKEHOUSE_HOME": str(host_b / "home"),
        "DAGSTER_HOME": str(host_b / "dagster"),
        STORAGE_ROOT_ENV: str(lake.paths.home),
    }

    # Host A plans its commit, then stalls; host B commits the same batches through the catalog.
    with lakehouse_paused_at(faults.COMMITTER_BEFORE_COMMIT, tmp_path) as host_a_log:
        completed = run_pipeline(on_host_b)
        assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]

    # The catalog refused host A's publish: its requirement (main still at the snapshot it
    # planned from) no longer held.
    assert_publish_refused(host_a_log, completed)
    assert run_pipeline().returncode == 0
    assert_every_batch_once(lake)


def test_the_store_killed_mid_commit_and_restarted_loses_and_duplicates_nothing(lake, s3_server, tmp_path):
    land_round(lake, 1)
    paused = start_paused_at(faults.COMMITTER_BEFORE_COMMIT, tmp_path)

    # The store dies (SIGKILL) as a commit's files are about to be written, and comes back
    # STORE_DOWN_SECONDS later, while the clients (Spark's S3FileIO, the catalog's) retry.
    s3_server.stop(kill=True)
    paused.release()
    time.sleep(STORE_DOWN_SECONDS)
    s3_server.start()
    paused.process.wait(timeout=600)

    # Whether that run rode the outage through or failed, the next run leaves every batch once.
    completed = run_pipeline()
    output = completed.stdout[-3000:] + completed.stderr[-3000:] + paused.log.read_text()[-3000:]
    assert completed.returncode == 0, output
    assert_every_batch_once(lake)


def test_a_store_that_throttles_and_stalls_requests_loses_and_duplicates_nothing(lake, s3_server):
    land_round(lake, 1)
    # Every request of the pipeline's clients (Spark's S3FileIO, PyIceberg, DuckDB's checks) goes
    # through a proxy that answers every 7th with 503 Slow Down and holds every 5th for a second.
    proxy = FaultyStoreProxy(s3_server.port, throttle_every=7, stall_every=5, stall_seconds=1.0)
    config_file = Path(os.environ["LAKEHOUSE_CONFIG"])
    config = yaml.safe_load(config_file.read_text())
    config["catalog"]["s3.endpoint"] = proxy.endpoint
    config_file.write_text(yaml.safe_dump(config))
    try:
        completed = run_pipeline()
    finally:
        proxy.close()

    # The clients retried: the run succeeded, and each batch is in its table once, every file
    # the tables reference on the store (DuckDB reads them all, straight from the store).
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert proxy.throttled > 0 and proxy.stalled > 0, (proxy.requests, proxy.throttled, proxy.stalled)
    assert_every_batch_once(lake)


# The file's last test: its orphan removal deletes the first round's data files (compacted, their
# snapshots expired), which every other test's restored tables still reference.
def test_maintenance_on_the_store_compacts_expires_and_removes_orphans_and_loses_nothing(lake, s3_server):
    land_round(lake, 1)
    assert run_pipeline().returncode == 0
    # Earlier tests' commits, which the restored catalog does not reference, are orphans on the
    # store; the store dates objects when written, so the orphan grace is made a second here.
    config_file = Path(os.environ["LAKEHOUSE_CONFIG"])
    config = yaml.safe_load(config_file.read_text())
    for stream in config["streams"]:
        stream["maintenance"]["remove_orphan_files"] = {"older_than": "1s"}
    config_file.write_text(yaml.safe_dump(config))
    # A file no commit wrote, in the orders table's data prefix.
    planted = f"{lake.require_table('sales.orders').location()}/data/planted-orphan.parquet"
    store = s3_server.file_system()
    with store.open_output_stream(planted.removeprefix("s3://")) as out:
        out.write(b"not referenced by any snapshot")
    time.sleep(2)

    completed = run_lakehouse(["maintain"])

    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "compaction.rewritten_data_files_count" in completed.stdout
    # The orphan action lists the table's prefix through S3FileIO (no Hadoop file system for s3://),
    # and what it reports removed is gone from the store.
    assert "remove_orphan_files.orphan_files_left: 0" in completed.stdout, completed.stdout
    assert store.get_file_info(planted.removeprefix("s3://")).type == fs.FileType.NotFound
    assert_every_batch_once(lake)  # every file the tables reference is still on the store


def test_the_object_store_demo_runs_on_the_deploy_pages_catalog_map_with_its_keys_named_not_written(
    rest_catalog, s3_server, tmp_path, monkeypatch, capsys
):
    """What ``lakehouse demo --object-store`` runs, on this session's servers instead of its own
    (which start as the session's fixtures start theirs): the demo, in this process instead of one
    of its own, with the environment the command gives it and writes for another shell. The tables
    are the catalog's, on the store, DuckDB reads them there, and the configuration names the
    store's keys without holding them."""
    client, tables = _tables(rest_catalog)
    for identifier in tables:  # the demo's sales.orders is another table than the fault pipeline's
        client.drop_table(identifier)
    home = tmp_path / "demo"
    home.mkdir()
    monkeypatch.setenv("LAKEHOUSE_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    environment = demo_environment(rest_catalog, LakehousePaths.from_env())
    for name, value in environment.items():
        monkeypatch.setenv(name, value)

    assert run_demo(50) == 0

    printed = capsys.readouterr().out
    assert "DuckDB reads 50 rows from sales.orders" in printed, printed
    assert "missing required field 'order_id'" in printed, printed  # the broken event, read on the store
    assert s3_server.secret_access_key not in printed
    written = Path(environment[CONFIG_ENV]).read_text()
    catalog = yaml.safe_load(written)["catalog"]
    assert (catalog["type"], catalog["uri"], catalog["s3.endpoint"]) == ("rest", rest_catalog.uri, s3_server.endpoint)
    assert catalog["s3.secret-access-key"] == f"${{env:{DEMO_SECRET_ENV}}}"
    assert s3_server.secret_access_key not in written
    assert _tables(rest_catalog)[1]["sales.orders"].startswith(f"s3://{OBJECT_STORE_BUCKET}/")
    assert not (home / "warehouse").exists()
    # Another shell gets the same environment from the file the command writes, and no one else reads it.
    sourced = tmp_path / "lakehouse.env"
    write_environment(sourced, environment | {"LAKEHOUSE_HOME": str(tmp_path / "a home with 'quotes' $and spaces")})
    assert sourced.stat().st_mode & 0o777 == 0o600
    shell = subprocess.run(
        ["bash", "-c", f"set -a; . {sourced}; set +a; env -0"], env={}, capture_output=True, text=True, check=True
    )
    seen = dict(line.split("=", 1) for line in shell.stdout.split("\0") if "=" in line)
    assert seen[KEY_ID_ENV] == s3_server.access_key_id and seen[DEMO_SECRET_ENV] == s3_server.secret_access_key
    assert seen["LAKEHOUSE_HOME"] == str(tmp_path / "a home with 'quotes' $and spaces")
