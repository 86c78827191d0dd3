"""The Spark host: Dagster runs share one warm Spark driver, which a crash cannot turn into a lost
or duplicated batch, and whose errors reach the run that called it."""

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
import yaml

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.cli import main as cli
from lakehouse_assets.commit.recovery import lakehouse_commits
from lakehouse_assets.config.loader import load_config
from lakehouse_assets.config.spec import parse_config
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.engine.spark import MASTER_ENV
from lakehouse_assets.engine.spark_host import RemoteCallError, SparkHostError, call_on_host, host_pid, stop_hosts
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.ingest.micro_batching import mint_next_batch
from lakehouse_assets.ingest.staging import stage_batch
from lakehouse_assets.ingest.table_commits import commit_table
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets_tests.conftest import ORDERS_STREAM, order_event, write_config
from lakehouse_assets_tests.test_pipeline import _duckdb_rows

pytestmark = pytest.mark.spark


@pytest.fixture
def stops_hosts(lake):
    """Stops the home's Spark hosts after the test, as their idle timeout would later: every host
    that runs or is still starting holds its alive lock."""
    yield
    stop_hosts(lake, wait_seconds=0)


# A stream of the shared home that only the stop tests stage (and nothing commits), so that the
# table the host-killed test commits to holds its batches alone, in whatever order the tests run.
HELD_STREAM = {**ORDERS_STREAM, "name": "held", "table_identifier": "sales.held"}


@pytest.fixture(scope="module")
def shared_home_environment(tmp_path_factory, dagster_home_template):
    """The environment of one home for the tests below that kill, stop or merely call its host and
    need no home of their own: the host a test kills is the one an earlier test left running (or
    the one its first call starts), and the host that replaces it serves the next test, instead of
    every test paying for a cold host of its own and for its replacement (about 5 CPU-seconds
    each). Their hosts are stopped when the module ends."""
    base = tmp_path_factory.mktemp("shared-host-home")
    shutil.copytree(dagster_home_template, base / "dagster")
    config = base / "lakehouse.yaml"
    document = {"catalog": {"type": "hadoop"}, "streams": [ORDERS_STREAM, HELD_STREAM]}
    config.write_text(yaml.safe_dump({"spark_host": {"start_early": False}, **document}))
    environment = {
        "LAKEHOUSE_HOME": str(base / "lakehouse"),
        "DAGSTER_HOME": str(base / "dagster"),
        "LAKEHOUSE_CONFIG": str(config),
    }
    yield environment
    with _in_home(environment) as lake:
        stop_hosts(lake, wait_seconds=0)


@contextmanager
def _in_home(environment: dict[str, str]) -> Iterator[Lakehouse]:
    """The home of ``environment`` in use until the block ends (set without the test's
    ``monkeypatch``); its lakehouse."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        yield Lakehouse.from_env()


@pytest.fixture
def shared_lake(shared_home_environment, request):
    """The shared home in use for one test, with whatever host the tests before left running.
    Its environment is set here, not with ``monkeypatch``, and undone before the suite's
    ``no_spark_host_outlives_its_test`` (an autouse fixture, set up first, torn down last) looks
    at it, so that the host goes on to the next test. A test that failed stops the home's hosts:
    the next one starts from a new host, not from one the failure left armed or held."""
    failed = request.session.testsfailed
    with _in_home(shared_home_environment) as lake:
        yield lake
        if request.session.testsfailed > failed:
            stop_hosts(lake, wait_seconds=0)


def _log_from(lake, offset: int) -> str:
    """What the home's hosts logged after ``offset`` (the log's size when a test began)."""
    with (lake.paths.state / "spark-host.log").open("rb") as log:
        log.seek(offset)
        return log.read().decode()


def _log_size(lake) -> int:
    log = lake.paths.state / "spark-host.log"
    return log.stat().st_size if log.exists() else 0


def _landing_tick(config, instance, until_idle=True, stream="orders") -> dg.SensorResult:
    """The landing sensor's tick: as ``lakehouse run`` ticks it, or with ``until_idle=False`` as the daemon does."""
    defs = build_definitions(config)
    context = dg.build_sensor_context(
        instance=instance, definitions=defs, resources={"lakehouse": LakehouseResource(until_idle=until_idle)}
    )
    return defs.get_repository_def().get_sensor_def(names.landing_sensor_name(stream)).evaluate_tick(context)


def _execute(config, instance, request, stream="orders"):
    """Execute the writer run of ``request`` as the daemon would (with the default resources, so
    its engine calls go to the Spark host)."""
    job = build_definitions(config).get_repository_def().get_job(names.stage_job_name(stream))
    return job.execute_in_process(run_config=request.run_config, instance=instance, raise_on_error=False)


def _writer_run(config, instance, stream="orders"):
    """Tick the landing sensor and execute the writer run it requests."""
    [request] = _landing_tick(config, instance, stream=stream).run_requests
    return _execute(config, instance, request, stream)


def _session_master(spark, _lake) -> str:
    spark.range(10).count()
    return spark.sparkContext.master


def test_writer_runs_stage_and_commit_on_one_warm_host(lake, instance, stops_hosts, monkeypatch):
    # The host takes its Spark master from the same override as a ``lakehouse`` process (which
    # test_jdbc_catalog.py runs on a standalone cluster).
    monkeypatch.setenv(MASTER_ENV, "local[1]")
    stream = lake.stream("orders")
    land_events(lake.paths, stream, [order_event(i) for i in range(1, 101)])

    first = _writer_run(lake.config, instance)
    host = host_pid(lake)
    land_events(lake.paths, stream, [order_event(i) for i in range(101, 151)])
    second = _writer_run(lake.config, instance)

    assert first.success and second.success
    assert host is not None and host != os.getpid()
    assert host_pid(lake) == host, "the second run must reuse the first run's host"
    assert call_on_host(lake, _session_master) == "local[1]"
    assert [row[0] for row in _duckdb_rows(lake, "sales.orders", "order_id")] == list(range(1, 151))
    commits = lakehouse_commits(lake.table("sales.orders"))
    assert [(c.first_sequence, c.last_sequence, c.rows) for c in commits] == [(1, 1, 100), (2, 2, 50)]
    table_key = names.table_key("sales.orders")
    metadata = instance.get_latest_materialization_event(table_key).asset_materialization.metadata
    assert metadata["rows"].value == 50
    # Dagster's standard table metadata, which the UI shows on the table's page.
    assert metadata[names.ROW_COUNT_METADATA].value == 150
    assert metadata[names.TABLE_NAME_METADATA].value == "lake.sales.orders"
    assert metadata[names.URI_METADATA].value.endswith("sales/orders")
    columns = metadata[names.COLUMN_SCHEMA_METADATA].value.columns
    assert [(c.name, c.type, c.constraints.nullable) for c in columns][:2] == [
        ("order_id", "long", False),
        ("customer_id", "long", True),
    ]
    for check_name in names.CHECK_NAMES:
        record = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(table_key, check_name))
        assert record.status.value == "SUCCEEDED", check_name


def test_an_error_on_the_host_reaches_the_caller_as_itself_or_as_text(shared_lake):
    """The package's errors pickle and arrive as themselves; Spark's hold JVM references and do
    not: the caller gets their type, message and the host's traceback, not an unpickling error."""
    lake = shared_lake
    with pytest.raises(LakehouseError, match="batch 7 was never minted"):
        call_on_host(lake, stage_batch, lake.stream("orders"), 7)
    with pytest.raises(RemoteCallError, match=r"(?s)AnalysisException on the Spark host: .*no_such_table"):
        call_on_host(lake, _query_missing_table)


def _query_missing_table(spark, _lake) -> None:
    spark.sql("SELECT * FROM no_such_table").collect()


def _armed_host(lake, point: str) -> int:
    """Arm the home's host (started now if none runs) to die at ``point``: a call sets the fault
    point in the host's own environment, which it reads at each point. The hosts started after it
    have the caller's environment, without it. Returns the armed host's process id."""
    return call_on_host(lake, _arm, point)


def _arm(_spark, _lake, point: str) -> int:
    os.environ[faults.CRASH_ENV] = point
    return os.getpid()


def _process_id(_spark, _lake) -> int:
    return os.getpid()


def _jvm_pid(_spark, _lake) -> int:
    from pyspark import SparkContext

    return SparkContext._gateway.proc.pid


def _jvm_scratch(_spark, _lake) -> str:
    """The JVM's scratch directory (``spark-<id>`` under ``spark.local.dir``)."""
    from pyspark import SparkFiles

    return str(Path(SparkFiles.getRootDirectory()).parent)


# One point of each kind of call: the stage call, and the commit call once its write has landed,
# where the repeated call must find that commit in the table instead of making it again. Every
# point of ``faults.CRASH_POINTS`` is killed in a real pipeline process, and the call repeated on
# a new host is the same engine call a restarted run makes (``test_faults.py``). Each point costs
# a cold host, the one that replaces the host killed there (about 5 CPU-seconds).
HOST_CRASH_POINTS = (faults.WRITER_AFTER_STAGING, faults.COMMITTER_AFTER_COMMIT)


def test_a_host_killed_in_a_call_is_replaced_and_the_call_repeated(shared_lake):
    lake = shared_lake
    stream = lake.stream("orders")
    for round_number, point in enumerate(HOST_CRASH_POINTS):
        first = round_number * 20 + 1
        land_events(lake.paths, stream, [order_event(i) for i in range(first, first + 20)])
        batch, _ = mint_next_batch(lake, stream, drain=True)
        armed = _armed_host(lake, point)

        # The armed host dies at the point during one of the calls; the call is repeated on a new host.
        call_on_host(lake, stage_batch, stream, batch.sequence)
        outcome = call_on_host(lake, commit_table, "sales.orders", f"run-{round_number}")

        assert host_pid(lake) != armed, f"the host armed at {point} did not die there"
        assert outcome.plans[0].recovered or outcome.results, point
        assert lake.ledger("orders").batch(batch.sequence).committed is not None, point

    expected = list(range(1, len(HOST_CRASH_POINTS) * 20 + 1))
    assert [row[0] for row in _duckdb_rows(lake, "sales.orders", "order_id")] == expected
    commits = lakehouse_commits(lake.table("sales.orders"))
    assert [(c.first_sequence, c.last_sequence, c.rows) for c in commits] == [
        (n, n, 20) for n in range(1, len(HOST_CRASH_POINTS) + 1)
    ]


def test_a_killed_host_or_jvm_between_calls_is_replaced_by_the_next_call(shared_lake):
    lake = shared_lake
    for victim in ("host", "jvm"):
        dead_host = call_on_host(lake, _process_id)
        scratch = Path(call_on_host(lake, _jvm_scratch))
        os.kill(dead_host if victim == "host" else call_on_host(lake, _jvm_pid), signal.SIGKILL)

        assert call_on_host(lake, _process_id) != dead_host, victim
        # A JVM killed outright cleans nothing up: its jars are on its class path, not copied into
        # its scratch directory (45 MB for the Iceberg runtime, left behind by every such kill).
        assert list(scratch.rglob("*.jar")) == [], victim


# Where the call is held when the host is told to stop: in the middle of its Spark work, and with
# its work done and its answer not sent yet (a host that counted the call finished before answering
# it once exited there under load and lost the answer).
STOP_POINTS = (faults.WRITER_AFTER_STAGING, faults.at(faults.HOST_BEFORE_ANSWER, stage_batch.__name__))


def _hold_at(_spark, _lake, point: str, directory: str) -> int:
    """Hold the host's calls at ``point`` from now on (its pause files in ``directory``), set in
    the host's own environment, which it reads at each point (as ``_arm`` does for a crash).
    Returns the held host's process id."""
    os.environ[faults.PAUSE_DIR_ENV] = directory
    os.environ[faults.PAUSE_ENV] = point
    return os.getpid()


@pytest.mark.parametrize("point", STOP_POINTS)
def test_a_host_told_to_stop_during_a_call_answers_it_and_exits_cleanly(shared_lake, tmp_path, point):
    lake = shared_lake
    stream = lake.stream("held")
    land_events(lake.paths, stream, [order_event(i) for i in range(1, 31)])
    batch, _ = mint_next_batch(lake, stream, drain=True)
    logged = _log_size(lake)  # the shared home's log holds the earlier tests' hosts too
    host = call_on_host(lake, _hold_at, point, str(tmp_path))

    with ThreadPoolExecutor(1) as pool:
        staging = pool.submit(call_on_host, lake, stage_batch, stream, batch.sequence)
        deadline = time.monotonic() + 120
        while not (tmp_path / f"{point}.paused").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / f"{point}.paused").exists(), f"the call never reached {point}"
        os.kill(host, signal.SIGTERM)  # mid-call: the host takes no new call, then answers this one
        while host_pid(lake) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_pid(lake) is None, "a stopping host must take no new calls"
        assert _exit_status(host, timeout=1.0) is None, "a stopping host waits for the call it has not answered"
        (tmp_path / f"{point}.release").touch()
        staging.result(timeout=120)

    assert _exit_status(host) == 0
    assert lake.ledger("held").batch(batch.sequence).staged is not None
    text = _log_from(lake, logged)
    assert "SIGTERM: taking no new calls" in text and "stopped" in text and "Traceback" not in text
    assert text.count("stage_batch in ") == 1, "the call was answered, not repeated on a new host"
    assert call_on_host(lake, _process_id) != host, "the next call starts a new host"


def _sleep(_spark, _lake, seconds: float) -> None:
    time.sleep(seconds)


def test_a_host_that_does_not_answer_within_the_call_timeout_is_killed(shared_lake):
    lake = shared_lake
    document = yaml.safe_load(Path(os.environ["LAKEHOUSE_CONFIG"]).read_text())
    document["spark_host"] = {"call_timeout": "2s"}
    # The same home and host address, only its calls under the short timeout (the environment
    # stays the shared home's, so the host started next serves the next test as any other).
    hung = Lakehouse(parse_config(document), lake.paths)
    # Only the sleeping call runs under the short timeout: the same home's host answers the others
    # under the default one, which a new host's first call on a loaded machine can take over 2 s.
    host = call_on_host(lake, _process_id)

    with pytest.raises(SparkHostError, match="did not answer _sleep within spark_host.call_timeout"):
        call_on_host(hung, _sleep, 60)

    assert _exit_status(host) == -signal.SIGKILL
    assert call_on_host(lake, _process_id) != host, "the next call starts a new host"


def _exit_status(pid: int, timeout: float = 60.0) -> int | None:
    """The exit code of a host this test process started (its child), waiting up to ``timeout``
    seconds for it; None if it still runs (a host that was to exit or be killed idles for 10 min).
    A host that exited while this process started another is reaped by that start (``subprocess``
    reaps the processes of dropped ``Popen`` objects), and its exit code is lost: a failure."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            exited, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            raise AssertionError(f"host {pid} exited and a later host's start reaped it: exit code lost") from None
        if exited:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def _started_host(lake) -> int:
    """The process id of the last host started for the home (from its alive lock)."""
    [alive] = lake.paths.state.glob("*.alive")
    return int(alive.read_text().split()[0])


def test_a_landing_sensor_starts_the_host_early_and_the_writer_run_waits_for_that_host(
    tmp_path, lake, instance, monkeypatch, stops_hosts
):
    document = yaml.safe_load(Path(os.environ["LAKEHOUSE_CONFIG"]).read_text())
    document["spark_host"] = {"start_early": True}
    write_config(tmp_path, document, monkeypatch)
    config = load_config()
    stream = config.stream("orders")
    landed = land_events(lake.paths, stream, [order_event(i) for i in range(1, 31)])

    # Events pending but not due (flush.max_age 60 s): no run yet, the host is starting.
    waiting = _landing_tick(config, instance, until_idle=False)
    starting = _started_host(lake)
    assert waiting.run_requests == [] and "pending" in waiting.skip_message
    # Due now: the writer run, launched while the host still starts, waits for that one.
    os.utime(landed[0], (0, 0))
    [request] = _landing_tick(config, instance, until_idle=False).run_requests
    assert host_pid(lake) is None, "the host answered before the run: the run would not have to wait"
    result = _execute(config, instance, request)
    # A tick while the host runs starts no other.
    _landing_tick(config, instance, until_idle=False)

    assert result.success
    assert host_pid(lake) == starting
    assert _started_host(lake) == starting
    assert [row[0] for row in _duckdb_rows(lake, "sales.orders", "order_id")] == list(range(1, 31))


def _long_job(spark, _lake) -> int:
    """Minutes of Spark work on 2 cores, unless cancelled."""
    return spark.range(0, 1 << 40, 1, 2).selectExpr("sum(id)").first()[0]


def _active_jobs(spark, _lake) -> list[int]:
    return list(spark.sparkContext.statusTracker().getActiveJobsIds())


CALLER = """
from lakehouse_assets.engine.spark_host import call_on_host
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets_tests.test_spark_host import _long_job

call_on_host(Lakehouse.from_env(), _long_job)
"""


def test_a_call_whose_caller_is_killed_stops_at_its_current_spark_job(shared_lake):
    lake = shared_lake
    logged = _log_size(lake)
    host = call_on_host(lake, _process_id)
    caller = subprocess.Popen([sys.executable, "-c", CALLER])
    deadline = time.monotonic() + 120
    while not call_on_host(lake, _active_jobs):
        assert caller.poll() is None and time.monotonic() < deadline, "the long call never started its job"
        time.sleep(0.2)

    caller.kill()  # as a run worker killed, or terminated by Dagster, mid-call
    caller.wait()

    while call_on_host(lake, _active_jobs):
        assert time.monotonic() < deadline, "the call's Spark job ran on after its caller left"
        time.sleep(0.2)
    assert call_on_host(lake, _process_id) == host, "the same host goes on serving calls"
    assert "the caller of _long_job left" in _log_from(lake, logged)


# Last of the shared home's tests: it stops the host the others leave running.
def test_lakehouse_spark_host_stop_stops_the_homes_host_cleanly(shared_lake, capsys):
    """What ``make ui`` runs as it ends, so that the host's JVM does not idle on for its timeout."""
    host = call_on_host(shared_lake, _process_id)

    assert cli.main(["spark-host", "stop"]) == 0
    assert capsys.readouterr().out == f"stopped the Spark host {host}\n"
    assert _exit_status(host) == 0
    assert cli.main(["spark-host", "stop"]) == 0
    assert capsys.readouterr().out == "no Spark host runs for this home\n"
