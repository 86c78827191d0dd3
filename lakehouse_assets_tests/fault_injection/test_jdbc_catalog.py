"""The pipeline on Iceberg's JDBC catalog in a real PostgreSQL: end to end (also on a Spark
standalone cluster, with the Spark host), killed after a commit, raced, maintained and checked; and
raced from two hosts that share only the catalog and the storage, where the catalog's
compare-and-swap, not a lock, decides.

The first round runs once per session; each test starts from a copy of its files (same paths) and of
its catalog database (``CREATE DATABASE ... TEMPLATE``).
"""

import json
import os
import shutil
import signal
from pathlib import Path

import psycopg2
import pytest
import yaml

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.commit.branches import audit_state
from lakehouse_assets.commit.pass_branches import PASS_BRANCH_PREFIX
from lakehouse_assets.engine.spark import DRIVER_MEMORY_ENV, ICEBERG_RUNTIME_JAR, MASTER_ENV
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.paths import STORAGE_ROOT_ENV
from lakehouse_assets.quality.duck import iceberg_connection, scan
from lakehouse_assets_tests.fault_injection.invariants import (
    FAULT_PIPELINE_TABLES,
    assert_every_batch_once,
    invariant_violations,
)
from lakehouse_assets_tests.fault_injection.pipeline import (
    PIPELINE,
    assert_publish_refused,
    lakehouse_paused_at,
    land_round,
    run_lakehouse,
    run_pipeline,
    run_two_pipelines_at_once,
)
from lakehouse_assets_tests.fault_injection.template_homes import restored_home, use_home
from lakehouse_assets_tests.postgres_server import SERVER_USER, PostgresServer, jdbc_driver_jar
from lakehouse_assets_tests.spark_cluster import cluster_environment, standalone_cluster

pytestmark = pytest.mark.spark

DATABASE = "lakehouse"
FIRST_ROUND_DATABASE = "lakehouse_first_round"
PASSWORD_ENV = "LAKEHOUSE_TEST_CATALOG_PASSWORD"
# Trust authentication ignores it; it stands for a secret that must reach no file and no log.
PASSWORD = "not-for-logs-7f3a9c"
TABLES = FAULT_PIPELINE_TABLES


def jdbc_pipeline(server: PostgresServer) -> dict:
    return {
        "catalog": {
            "type": "jdbc",
            "uri": f"jdbc:postgresql://127.0.0.1:{server.port}/{DATABASE}",
            "jdbc.user": SERVER_USER,
            "jdbc.password": f"${{env:{PASSWORD_ENV}}}",
        },
        "spark": {"spark.jars": jdbc_driver_jar()},
        **PIPELINE,
    }


@pytest.fixture(scope="session")
def jdbc_first_round(tmp_path_factory: pytest.TempPathFactory, postgres: PostgresServer) -> Path:
    base = tmp_path_factory.mktemp("jdbc-pipeline")
    work = base / "work"
    (work / "dagster").mkdir(parents=True)
    (work / "lakehouse.yaml").write_text(yaml.safe_dump(jdbc_pipeline(postgres)))
    postgres.create_database(DATABASE)
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_home(work, monkeypatch)
        monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
        lake = Lakehouse.from_env()
        land_round(lake, 0)
        completed = run_pipeline()
        assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
        assert invariant_violations(lake) == []
    postgres.clone_database(DATABASE, FIRST_ROUND_DATABASE)
    shutil.copytree(work, base / "template")
    return base


@pytest.fixture
def lakehouse_home(jdbc_first_round: Path, postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The JDBC pipeline's home and catalog database with the first round committed."""
    home = restored_home(jdbc_first_round, monkeypatch)
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    postgres.clone_database(FIRST_ROUND_DATABASE, DATABASE)
    return home


def _catalog_rows(server: PostgresServer) -> dict[str, str]:
    connection = psycopg2.connect(host="127.0.0.1", port=server.port, user=SERVER_USER, dbname=DATABASE)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT table_namespace, table_name, metadata_location FROM iceberg_tables")
            return {f"{namespace}.{name}": location for namespace, name, location in cursor.fetchall()}
    finally:
        connection.close()


def _second_host(lake: Lakehouse, tmp_path: Path) -> dict[str, str]:
    """The environment of host B: its own home (locks, Dagster instance), this home as the shared
    storage root, the same catalog."""
    host_b = tmp_path / "host-b"
    (host_b / "dagster").mkdir(parents=True)
    return {
        "LAKEHOUSE_HOME": str(host_b / "home"),
        "DAGSTER_HOME": str(host_b / "dagster"),
        STORAGE_ROOT_ENV: str(lake.paths.home),
    }


def _files_containing(root: Path, needle: str) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and needle.encode() in path.read_bytes():
            found.append(path)
    return found


def test_both_pipelines_commit_exactly_once_and_pass_their_checks(lake, postgres):
    land_round(lake, 1)
    completed = run_pipeline()
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]

    assert invariant_violations(lake) == []
    # The tables are the catalog's: PostgreSQL names their current metadata, no Hadoop layout exists.
    rows = _catalog_rows(postgres)
    assert set(TABLES) | {"sales.orders_dead_letters", "crm.customers_dead_letters"} <= set(rows)
    assert not list(lake.paths.warehouse.rglob("version-hint.text"))
    # Each pass published its own branch and removed it in the same commit: none is left.
    for identifier in rows:
        refs = set(lake.table(identifier).metadata.refs)
        assert refs == {"main"}, f"{identifier}: {refs}"
    checked = run_lakehouse(["check"])
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    # The catalog password came from the environment and went nowhere else.
    assert PASSWORD not in completed.stdout + completed.stderr + checked.stdout + checked.stderr
    assert _files_containing(lake.paths.home.parent, PASSWORD) == []


def test_both_pipelines_run_on_a_standalone_cluster(lake, tmp_path):
    """Long (30-80 s on a busy machine: four JVMs on two cores): a master, a worker, and a
    ``lakehouse run`` driver with its executor JVM on the cluster. The Iceberg runtime jar and the
    JDBC driver reach the executor through ``spark.jars``; the storage is the local disk, which
    every process of one machine sees. (The Spark host takes its master from the same setting:
    ``test_spark_host.py``.)"""
    land_round(lake, 1)

    with standalone_cluster(tmp_path / "cluster") as cluster:
        on_cluster = {
            **cluster_environment(tmp_path / "cluster"),
            MASTER_ENV: cluster.master_url,
            DRIVER_MEMORY_ENV: "1g",
        }
        completed = run_pipeline(on_cluster)
        assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]

        assert cluster.completed_app_names() == ["lakehouse_assets"], cluster.state()
        [app_dir] = cluster.application_dirs()
        # The executor fetched the Iceberg runtime and the JDBC driver from the driver
        # (``spark.jars``) and ran tasks.
        for jar in (ICEBERG_RUNTIME_JAR, Path(jdbc_driver_jar()).name):
            assert list(app_dir.glob(f"*/{jar}")), f"no {jar} fetched into {app_dir}"
        executor_log = "\n".join(path.read_text(errors="replace") for path in app_dir.glob("*/stderr"))
        assert "Finished task" in executor_log, f"no task ran on the executor of {app_dir}"

    assert_every_batch_once(lake)


def test_a_pipeline_killed_after_its_commit_recovers_exactly_once(lake):
    land_round(lake, 1)

    # Killed cold (the JVM dies with the process), restarted on this worker's warm JVM: a new
    # process getting the JDBC driver from the config's ``spark.jars`` alone is what the
    # standalone cluster's driver proves.
    crashed = run_pipeline({faults.CRASH_ENV: faults.COMMITTER_AFTER_COMMIT}, cold=True)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-3000:] + crashed.stderr[-3000:]
    # On this catalog the commit lands on the pass's own branch: the kill leaves it unpublished.
    left = [name for identifier in TABLES for name in lake.table(identifier).metadata.refs]
    assert any(name.startswith(PASS_BRANCH_PREFIX) for name in left), left
    restarted = run_pipeline()
    assert restarted.returncode == 0, restarted.stdout[-3000:] + restarted.stderr[-3000:]

    assert invariant_violations(lake) == []


def test_two_committers_racing_commit_each_batch_once(lake, tmp_path):
    for round_number in (1, 2):
        land_round(lake, round_number)

    run_two_pipelines_at_once(tmp_path, cold=False)

    assert_every_batch_once(lake)


@pytest.mark.parametrize(
    "point", [faults.DEAD_LETTERS_BEFORE_COMMIT, faults.COMMITTER_BEFORE_COMMIT, faults.COMMITTER_BEFORE_PUBLISH]
)
def test_two_hosts_sharing_only_catalog_and_storage_commit_each_batch_once(point, lake, tmp_path):
    land_round(lake, 1)
    on_host_b = _second_host(lake, tmp_path)

    # Host A plans its commit (of the dead letters, or of the table), then stalls at the commit
    # point; host B commits the same batches and their dead letters.
    with lakehouse_paused_at(point, tmp_path) as host_a_log:
        completed = run_pipeline(on_host_b)
        assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]

    assert_publish_refused(host_a_log, completed)
    # Host B's home kept only what is local to it (state, Dagster): its storage is host A's home.
    assert sorted(path.name for path in Path(on_host_b["LAKEHOUSE_HOME"]).iterdir()) == ["state"]
    assert run_pipeline().returncode == 0
    assert_every_batch_once(lake)


def test_maintenance_on_another_host_between_a_commit_and_its_publish_keeps_each_batch_once(lake, tmp_path):
    land_round(lake, 1)
    assert run_pipeline().returncode == 0
    land_round(lake, 2)
    host_b = _second_host(lake, tmp_path)
    heads = {identifier: lake.table(identifier).current_snapshot().snapshot_id for identifier in TABLES}

    # Host A writes round 2 of crm.customers on its pass branch, then stalls before publishing (its
    # other passes go on); host B compacts, expires and removes orphans on the same tables, so main
    # moves under host A.
    paused_point = faults.at(faults.COMMITTER_BEFORE_PUBLISH, "crm.customers")
    with lakehouse_paused_at(paused_point, tmp_path) as host_a_log:
        maintained = run_lakehouse(["maintain"], host_b)
        assert maintained.returncode == 0, maintained.stdout[-3000:] + maintained.stderr[-3000:]
        moved = lake.table("crm.customers").current_snapshot().snapshot_id != heads["crm.customers"]
        assert moved, "host B's maintenance committed nothing to crm.customers; the race did not happen"

    assert_publish_refused(host_a_log, maintained)
    assert run_pipeline().returncode == 0
    assert_every_batch_once(lake)


def test_two_hosts_maintaining_one_table_at_once_keep_recovery_exactly_once(lake, tmp_path):
    """Long (40-75 s): host A is two real processes held at a fault point, while host B commits
    five rounds and maintains (compaction, expiry, orphan removal) twice; the expiry cuts the
    ancestry behind the checkpoints, and recovery stays exactly once on this catalog."""
    host_b = _second_host(lake, tmp_path)

    def commit_on_host_b(round_number: int) -> None:
        land_round(lake, round_number)
        completed = run_pipeline(host_b)
        assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]

    # Host A has read the tables to expire and is about to record their checkpoints; host B commits
    # and maintains the same tables: its checkpoints are newer, and it expires what A's would cover.
    commit_on_host_b(1)
    with lakehouse_paused_at(faults.MAINTENANCE_BEFORE_CHECKPOINT, tmp_path / "before", ("maintain",)) as host_a_log:
        commit_on_host_b(2)
        maintained = run_lakehouse(["maintain"], host_b)
        assert maintained.returncode == 0, maintained.stdout[-3000:] + maintained.stderr[-3000:]
    # Host A's first checkpoint was refused (the table had moved) and computed again.
    assert "expire_snapshots.checkpoint_attempts: 2" in host_a_log.read_text()
    for identifier in TABLES:
        table = lake.table(identifier)
        oldest = min(table.metadata.snapshots, key=lambda snapshot: snapshot.sequence_number)
        assert oldest.parent_snapshot_id is not None, f"{identifier}: expiry kept the whole history"

    # Host A has recorded its checkpoints and is about to expire; host B commits twice meanwhile,
    # so counting the last two snapshots from the new head would expire what the checkpoint lacks.
    commit_on_host_b(3)
    with lakehouse_paused_at(faults.MAINTENANCE_AFTER_CHECKPOINT, tmp_path / "after", ("maintain",)):
        commit_on_host_b(4)
        commit_on_host_b(5)

    land_round(lake, 6)
    completed = run_pipeline()
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert_every_batch_once(lake)


def test_two_hosts_adding_the_same_columns_at_once_both_go_on_and_each_batch_commits_once(lakehouse_home, tmp_path):
    config_file = Path(os.environ["LAKEHOUSE_CONFIG"])
    document = yaml.safe_load(config_file.read_text())
    for stream in document["streams"]:
        stream["schema_evolution"] = stream["name"] == "orders"
    config_file.write_text(yaml.safe_dump(document))
    lake = Lakehouse.from_env()
    land_round(lake, 1)
    coupons = [json.dumps({"order_id": 1000 + i, "amount": 1.0, "coupon": f"c{i}"}) for i in range(5)]
    land_events(lake.paths, lake.stream("orders"), coupons)

    # Host A has read the table's columns and is about to add `coupon`; host B adds it and commits.
    with lakehouse_paused_at(faults.SCHEMA_BEFORE_ADD_COLUMNS, tmp_path):
        completed = run_pipeline(_second_host(lake, tmp_path))
        assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
        assert "coupon" in lake.table("sales.orders").schema().column_names

    assert run_pipeline().returncode == 0
    assert_every_batch_once(lake)
    orders = scan(lake.metadata_location("sales.orders"), lake.table("sales.orders").current_snapshot().snapshot_id)
    coupons_read = iceberg_connection().sql(f"SELECT coupon FROM {orders} WHERE coupon IS NOT NULL ORDER BY 1")
    assert [row[0] for row in coupons_read.fetchall()] == [f"c{i}" for i in range(5)]


def test_two_hosts_publishing_one_audited_snapshot_publish_it_and_its_dead_letters_once(lakehouse_home, tmp_path):
    config_file = Path(os.environ["LAKEHOUSE_CONFIG"])
    document = yaml.safe_load(config_file.read_text())
    [orders] = [stream for stream in document["streams"] if stream["name"] == "orders"]
    orders |= {"publish": "audit", "expectations": [{"name": "amount_not_negative", "condition": "amount >= 0"}]}
    config_file.write_text(yaml.safe_dump(document))
    lake = Lakehouse.from_env()
    land_round(lake, 1)
    land_events(lake.paths, lake.stream("orders"), [json.dumps({"order_id": 999, "amount": -4.0})])
    run_pipeline()  # its check fails: the round waits on the audit branch, its dead letter too
    audited = audit_state(lake.table("sales.orders"))
    assert audited.awaiting_publish, "the negative amount did not stop the round on the audit branch"
    orders["expectations"][0]["condition"] = "amount >= -10"
    config_file.write_text(yaml.safe_dump(document))
    publish = ("audit", "publish", "--table", "sales.orders")

    # Host A has written the round's dead letters on its pass branch and stalls before publishing
    # them; host B publishes the same snapshot (its dead letters, then main).
    with lakehouse_paused_at(faults.COMMITTER_BEFORE_PUBLISH, tmp_path, publish) as host_a_log:
        completed = run_lakehouse(list(publish), _second_host(lake, tmp_path))
        assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
        assert lake.table("sales.orders").current_snapshot().snapshot_id == audited.audit

    assert "nothing awaits publishing" in host_a_log.read_text()
    land_round(lake, 2)
    assert run_pipeline().returncode == 0
    assert_every_batch_once(lake)
