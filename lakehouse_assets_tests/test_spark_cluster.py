"""The append pipeline on a real Spark standalone cluster (master + one worker on this machine).

``lakehouse run --until-idle`` runs as its own process, so its driver is a fresh JVM whose master
is the cluster (``LAKEHOUSE_SPARK_MASTER``); the Iceberg runtime jar reaches the executor through
``spark.jars``. The storage root is the shared local disk, which every process of one machine sees.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.commit.recovery import lakehouse_commits
from lakehouse_assets.engine.spark import DRIVER_MEMORY_ENV, ICEBERG_RUNTIME_JAR, MASTER_ENV
from lakehouse_assets.engine.spark_host import call_on_host, host_pid
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.paths import STORAGE_ROOT_ENV
from lakehouse_assets.quality.duck import iceberg_connection, scan
from lakehouse_assets_tests.conftest import ORDERS_STREAM, order_event, write_config
from lakehouse_assets_tests.spark_cluster import cluster_environment, session_master, standalone_cluster

pytestmark = pytest.mark.spark

RUN_TIMEOUT_SECONDS = 150.0
APP_POLL_SECONDS = 30.0
HOST_STOP_SECONDS = 20.0
REPO_ROOT = Path(__file__).resolve().parents[1]
LAKEHOUSE_CLI = str(Path(sys.executable).with_name("lakehouse"))


def _run_until_idle(env: dict[str, str]) -> subprocess.CompletedProcess:
    completed = subprocess.run(
        [LAKEHOUSE_CLI, "run", "--until-idle"],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS,
        check=False,
    )
    assert completed.returncode == 0, f"lakehouse run failed:\n{completed.stdout}\n{completed.stderr}"
    return completed


def _stop_host(lake) -> None:
    pid = host_pid(lake)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + HOST_STOP_SECONDS
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)


def _completed_app_names(cluster) -> list[str]:
    """The master lists an application as completed once its driver has gone away."""
    deadline = time.monotonic() + APP_POLL_SECONDS
    while True:
        state = cluster.state()
        if not state.get("activeapps") or time.monotonic() > deadline:
            return [app["name"] for app in state.get("completedapps", [])]
        time.sleep(0.5)


def test_append_pipeline_runs_on_a_standalone_cluster_and_lands_every_event_once(
    lakehouse_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long (40-90 s on a busy machine): a master, a worker, and two drivers each with an executor
    JVM on the cluster (a `lakehouse run` process and the Spark host)."""
    write_config(
        tmp_path,
        {
            "catalog": {"type": "hadoop"},
            "spark": {"spark.executor.memory": "1g", "spark.executor.cores": "1"},
            "streams": [ORDERS_STREAM],
        },
        monkeypatch,
    )
    # The storage root (warehouse, landing, staging) apart from the home (state, Dagster), on the
    # local disk that the driver and the executor share.
    monkeypatch.setenv(STORAGE_ROOT_ENV, str(tmp_path / "storage"))
    lake = Lakehouse.from_env()
    stream = lake.stream("orders")
    expected: list[int] = []
    with standalone_cluster(tmp_path / "cluster") as cluster:
        env = {
            **cluster_environment(tmp_path / "cluster"),
            MASTER_ENV: cluster.master_url,
            DRIVER_MEMORY_ENV: "1g",
        }
        # The driver cuts the two files it finds into one batch.
        for order_ids in (range(1, 126), range(126, 251)):
            land_events(lake.paths, stream, [order_event(i) for i in order_ids])
            expected.extend(order_ids)
        _run_until_idle(env)

        # The Spark host that Dagster runs share takes its master from the same override.
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
        try:
            assert call_on_host(lake, session_master) == cluster.master_url
        finally:
            _stop_host(lake)

        assert _completed_app_names(cluster) == ["lakehouse_assets"] * 2, cluster.state()
        app_dirs = cluster.application_dirs()
        assert len(app_dirs) == 2, f"expected one executor work dir per driver, found {app_dirs}"
        for app_dir in app_dirs:
            # The executor fetched the Iceberg runtime from the driver (``spark.jars``) and ran tasks.
            assert list(app_dir.glob(f"*/{ICEBERG_RUNTIME_JAR}")), f"no Iceberg jar fetched into {app_dir}"
            executor_log = "\n".join(path.read_text(errors="replace") for path in app_dir.glob("*/stderr"))
            assert "Finished task" in executor_log, f"no task ran on the executor of {app_dir}"

    table = lake.table("sales.orders")
    location = lake.metadata_location("sales.orders")
    relation = scan(location, table.current_snapshot().snapshot_id)
    rows = iceberg_connection().sql(f"SELECT order_id, count(*) FROM {relation} GROUP BY 1 ORDER BY 1").fetchall()
    assert [order_id for order_id, _ in rows] == expected
    assert {count for _, count in rows} == {1}, [row for row in rows if row[1] != 1]
    commits = [(c.stream, c.first_sequence, c.last_sequence, c.rows) for c in lakehouse_commits(table)]
    assert commits == [("orders", 1, 1, 250)]
    assert str(tmp_path / "storage" / "warehouse") in location, location
    assert not (lakehouse_home / "warehouse").exists()
