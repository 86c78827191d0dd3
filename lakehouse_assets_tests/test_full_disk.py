"""A full or read-only disk is an operating condition: the lakehouse home on a real small file
system (a tmpfs the test mounts; CI runs as root), filled to its last byte. Every command ends with
one line naming the path, what it was doing and the free space, and exit code 75; nothing partial
is left; producers are refused before the disk fills; and once space is freed the backlog commits
exactly once (DuckDB against the landed events) with no operator action."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import httpx
import pytest

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import land_events, landing_dir
from lakehouse_assets.config.loader import load_config
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.defs.sensors import unstaged_batch_request
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.quality.duck import iceberg_connection, scan
from lakehouse_assets.runner import run_job
from lakehouse_assets.storage_space import STORAGE_EXIT_CODE
from lakehouse_assets_tests.conftest import ORDERS_STREAM, order_event, write_config
from lakehouse_assets_tests.fault_injection.pipeline import (
    AGGRESSIVE_MAINTENANCE,
    RUN_UNTIL_IDLE,
    lakehouse_process_command,
    run_lakehouse,
    start_paused_at,
)
from lakehouse_assets_tests.http_server import HttpServer, request

DISK_BYTES = 96 * 1024 * 1024
EVENTS_PER_ROUND = 2_000


@dataclass
class SmallDisk:
    """A tmpfs of ``DISK_BYTES`` at ``root``; ``fill`` takes every free byte, ``free`` gives them back."""

    root: Path

    @property
    def filler(self) -> Path:
        return self.root / "filler"

    def fill(self) -> None:
        with open(self.filler, "ab") as handle:
            while (room := os.statvfs(self.root).f_bavail * os.statvfs(self.root).f_frsize) > 0:
                os.posix_fallocate(handle.fileno(), os.fstat(handle.fileno()).st_size, room)

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    root = tmp_path / "disk"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(root)], check=True)
    try:
        yield SmallDisk(root)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=True)


def _use_disk(
    disk: SmallDisk, monkeypatch: pytest.MonkeyPatch, dagster_home: Path, stream: dict = ORDERS_STREAM, **storage: int
) -> Lakehouse:
    """The lakehouse home on ``disk``, the Dagster instance at ``dagster_home``, the orders ``stream``."""
    monkeypatch.setenv("LAKEHOUSE_HOME", str(disk.root / "lakehouse"))
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    dagster_home.mkdir(exist_ok=True)
    document = {"catalog": {"type": "hadoop"}, "streams": [stream], "storage": storage}
    write_config(disk.root.parent, document, monkeypatch)
    return Lakehouse.from_env()


def _land_round(lake: Lakehouse, round_number: int) -> set[int]:
    """Land ``EVENTS_PER_ROUND`` orders and one event without an order id (a dead letter); their ids."""
    ids = set(range(round_number * EVENTS_PER_ROUND, (round_number + 1) * EVENTS_PER_ROUND))
    events = [order_event(order_id) for order_id in sorted(ids)] + ['{"customer_id": 1}']
    land_events(lake.paths, lake.stream("orders"), events)
    return ids


def _committed_ids(lake: Lakehouse) -> list[int]:
    """The order ids of sales.orders' current snapshot, read by DuckDB."""
    table = lake.require_table("sales.orders")
    location = lake.metadata_location("sales.orders")
    assert location is not None
    rows = iceberg_connection().sql(f"SELECT order_id FROM {scan(location, table.current_snapshot().snapshot_id)}")
    return sorted(row[0] for row in rows.fetchall())


def _one_line(completed: subprocess.CompletedProcess, disk: SmallDisk) -> str:
    """The command's one line on standard error, after asserting exit code 75 and no traceback."""
    output = completed.stdout + completed.stderr
    assert completed.returncode == STORAGE_EXIT_CODE, output[-3000:]
    # The JVM's notice of the suite's own JVM options (``JAVA_TOOL_OPTIONS``) is not the command's.
    lines = [line for line in completed.stderr.strip().splitlines() if not line.startswith("Picked up JAVA_")]
    assert len(lines) == 1 and lines[0].startswith("lakehouse: "), output[-3000:]
    assert "Traceback" not in output and str(disk.root) in lines[0], output[-3000:]
    return lines[0]


def _files(directory: Path) -> set[Path]:
    return {path for path in directory.rglob("*") if path.is_file()}


@pytest.mark.spark
def test_every_command_meets_a_full_disk_with_one_line_and_the_backlog_commits_once_space_is_freed(
    small_disk, tmp_path, monkeypatch
):
    lake = _use_disk(small_disk, monkeypatch, small_disk.root / "dagster", min_free_bytes=0)
    landed = _land_round(lake, 0)
    assert run_lakehouse(["run", "--until-idle"]).returncode == 0
    landed |= _land_round(lake, 1)
    events = tmp_path / "more.ndjson"
    events.write_text("\n".join(order_event(order_id) for order_id in range(10**6, 10**6 + 100)) + "\n")
    warehouse_before = _files(lake.paths.warehouse)
    small_disk.fill()

    # A real process, as a user runs it: Spark's and Dagster's logs add nothing to the one line.
    command, env = lakehouse_process_command(["run", "--until-idle"], None)
    run = _one_line(subprocess.run(command, env=env, capture_output=True, text=True, timeout=300), small_disk)
    assert "running the pipeline" in run or "staging batch 2 of orders" in run, run
    ingest = _one_line(run_lakehouse(["ingest", "--stream", "orders", str(events)]), small_disk)
    # Refused by the headroom before the write would fail: the line says what is kept free.
    assert "has 0 B free of 96.0 MiB" in ingest and "nothing was landed" in ingest, ingest
    for arguments in (["maintain"], ["check"], ["dlq", "replay", "--table", "sales.orders"], ["demo", "--events", "5"]):
        _one_line(run_lakehouse(arguments), small_disk)
    # Reading needs no room: DuckDB reads the committed round.
    read = run_lakehouse(["sql", "--json", "SELECT count(*) AS n FROM sales.orders"])
    assert read.returncode == 0, read.stdout + read.stderr
    assert json.loads(read.stdout) == [{"n": EVENTS_PER_ROUND}], read.stdout

    # Nothing partial: no landing file half-written, no data file the failed write left.
    assert [p.name for p in landing_dir(lake.paths, lake.stream("orders")).iterdir() if p.name.startswith(".")] == []
    assert _files(lake.paths.warehouse) == warehouse_before

    small_disk.free()
    drained = run_lakehouse(["run", "--until-idle"])
    assert drained.returncode == 0, drained.stdout[-3000:] + drained.stderr[-3000:]
    assert _committed_ids(lake) == sorted(landed)
    checked = run_lakehouse(["check"])
    assert checked.returncode == 0 and "every blocking check passed" in checked.stdout, checked.stdout


@pytest.mark.spark
def test_a_read_only_disk_is_named_and_nothing_lands(small_disk, tmp_path, monkeypatch):
    lake = _use_disk(small_disk, monkeypatch, tmp_path / "dagster")
    landed = _land_round(lake, 0)
    assert run_lakehouse(["run", "--until-idle"]).returncode == 0
    _land_round(lake, 1)
    landing = landing_dir(lake.paths, lake.stream("orders"))
    before = sorted(landing.iterdir())
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk.root)], check=True)
    try:
        events = tmp_path / "events.ndjson"
        events.write_text(order_event(1) + "\n")
        line = _one_line(run_lakehouse(["ingest", "--stream", "orders", str(events)]), small_disk)
        assert "is read-only" in line, line
        assert "is read-only" in _one_line(run_lakehouse(["run", "--until-idle"]), small_disk)
        assert sorted(landing.iterdir()) == before
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk.root)], check=True)
    assert _committed_ids(lake) == sorted(landed)


@pytest.mark.spark
def test_producers_are_refused_below_the_headroom_while_the_pipeline_commits_what_landed(
    small_disk, tmp_path, monkeypatch
):
    # The headroom is more than the disk: every producer is refused, the pipeline is not.
    stream = {**ORDERS_STREAM, "source": {"landing": {"http": {"tokens": ["t0ken"]}}}}
    monkeypatch.setenv("LAKEHOUSE_HOME", str(small_disk.root / "lakehouse"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    (tmp_path / "dagster").mkdir()
    document = {"streams": [stream], "storage": {"min_free_bytes": 2 * DISK_BYTES}}
    write_config(tmp_path, document, monkeypatch)
    lake = Lakehouse.from_env()
    landed = _land_round(lake, 0)  # landed before the refusal (the library call has no headroom)

    events = tmp_path / "events.ndjson"
    events.write_text(order_event(10**6) + "\n")
    refused = _one_line(run_lakehouse(["ingest", "--stream", "orders", str(events)]), small_disk)
    assert "storage.min_free_bytes 192.0 MiB" in refused and "nothing was landed" in refused, refused

    server = HttpServer(tmp_path / "serve.log").start()
    try:
        answer = request(
            "POST",
            f"{server.url}/v1/streams/orders/events",
            content=order_event(10**6 + 1),
            headers={"Authorization": "Bearer t0ken", "Content-Type": "application/x-ndjson"},
            timeout=30,
        )
        assert answer.status_code == 503 and answer.headers.get("Retry-After"), answer.text
        assert "storage.min_free_bytes" in answer.text, answer.text
    finally:
        assert server.stop() == 0, (tmp_path / "serve.log").read_text()[-3000:]

    # The pipeline drains what had landed, and the status says how much room there is.
    assert run_lakehouse(["run", "--until-idle"]).returncode == 0
    assert _committed_ids(lake) == sorted(landed)
    status_output = run_lakehouse(["status"]).stdout
    assert f"storage root {small_disk.root / 'lakehouse'}: " in status_output, status_output
    assert "producers are refused below 192.0 MiB free" in status_output, status_output


def _post(server: HttpServer, body: str, key: str) -> httpx.Response:
    headers = {"Authorization": "Bearer t0ken", "Content-Type": "application/x-ndjson", "Idempotency-Key": key}
    return request("POST", f"{server.url}/v1/streams/orders/events", content=body, headers=headers, timeout=30)


@pytest.mark.spark
def test_lakehouse_serve_answers_503_naming_the_full_disk_and_lands_the_retried_request_once(
    small_disk, tmp_path, monkeypatch
):
    stream = {**ORDERS_STREAM, "source": {"landing": {"http": {"tokens": ["t0ken"]}}}}
    lake = _use_disk(small_disk, monkeypatch, tmp_path / "dagster", min_free_bytes=0)
    write_config(small_disk.root.parent, {"streams": [stream], "storage": {"min_free_bytes": 0}}, monkeypatch)
    body = "\n".join(order_event(order_id) for order_id in range(500)) + "\n"
    server = HttpServer(tmp_path / "serve.log").start()
    try:
        small_disk.fill()  # nothing landed yet, so no headroom refuses it: its landing write fails
        refused = _post(server, body, "request-1")
        assert refused.status_code == 503 and refused.headers.get("Retry-After"), refused.text
        assert f"landing the events: the file system of {small_disk.root}" in refused.text, refused.text
        small_disk.free()
        assert _post(server, body, "request-1").status_code == 200
        assert _post(server, body, "request-1").status_code == 200  # the producer's retry: acknowledged once
    finally:
        assert server.stop() == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert [p.name for p in landing_dir(lake.paths, lake.stream("orders")).iterdir() if p.name.startswith(".")] == []
    assert run_lakehouse(["run", "--until-idle"]).returncode == 0
    assert _committed_ids(Lakehouse.from_env()) == list(range(500))


@pytest.mark.spark
def test_a_writer_run_stopped_by_a_full_disk_says_so_on_the_sensor_and_the_stream_resumes_once_space_is_freed(
    small_disk, tmp_path, monkeypatch
):
    # Dagster's storage elsewhere, as in production (PostgreSQL): only the data's disk fills.
    lake = _use_disk(small_disk, monkeypatch, tmp_path / "dagster", min_free_bytes=0)
    landed = _land_round(lake, 0)
    defs = build_definitions(load_config())
    sensor = defs.get_repository_def().get_sensor_def(names.landing_sensor_name("orders"))
    daemon = {"lakehouse": LakehouseResource(until_idle=False)}

    def tick(instance: dg.DagsterInstance) -> dg.SensorResult:
        return sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs, resources=daemon))

    with dg.DagsterInstance.get() as instance:
        os.utime(next(landing_dir(lake.paths, lake.stream("orders")).iterdir()), (0, 0))  # aged: cut now
        # No room to record the batch it cuts: the tick says so and the next one tries again.
        small_disk.fill()
        full = f"the file system of {small_disk.root / 'lakehouse'} is full (0 B free of 96.0 MiB)"
        cut_nothing = tick(instance)
        assert cut_nothing.run_requests == [] and f"the sensor's tick: {full}" in cut_nothing.skip_message
        small_disk.free()
        [request] = tick(instance).run_requests
        job = defs.resolve_job_def(names.stage_job_name("orders"))
        small_disk.fill()
        failed = run_job(job, instance, request.run_config, request.tags)
        assert not failed.success

        backing_off = tick(instance)
        assert backing_off.run_requests == []
        # Its resources could not take the run's liveness lock (``state/``): the disk had no room.
        lock = f"taking the run's liveness lock: {full}"
        assert f"writer run {failed.run_id} failed: resources: {lock}" in backing_off.skip_message
        assert "requesting the batch again (retry 1)" in backing_off.skip_message

        small_disk.free()
        failed_at = instance.get_run_record_by_id(failed.run_id).end_time
        retry = unstaged_batch_request(instance, lake.ledger("orders").batch(1).minted, failed_at + 5).request
        assert retry is not None and retry.run_key == "orders:1:retry-1"
        assert run_job(job, instance, retry.run_config, retry.tags).success
    assert _committed_ids(lake) == sorted(landed)


# Each step a batch's life takes, held at its named point by a real process (attached to this
# worker's JVM), the disk filled, then let go: the write in the middle of it meets the full disk.
FILLED_IN_THE_MIDDLE = {
    "the writer's Parquet": (faults.WRITER_BEFORE_WRITE, RUN_UNTIL_IDLE),
    "the table's commit": (faults.COMMITTER_BEFORE_COMMIT, RUN_UNTIL_IDLE),
    "the dead letters' commit": (faults.DEAD_LETTERS_BEFORE_COMMIT, RUN_UNTIL_IDLE),
    "maintenance's checkpoint": (faults.MAINTENANCE_BEFORE_CHECKPOINT, ("maintain",)),
}


@pytest.mark.spark
@pytest.mark.parametrize("step", FILLED_IN_THE_MIDDLE)
def test_a_disk_filled_in_the_middle_of_a_step_fails_it_in_one_line_and_the_stream_resumes_once_freed(
    step, small_disk, tmp_path, monkeypatch
):
    point, arguments = FILLED_IN_THE_MIDDLE[step]
    stream = {**ORDERS_STREAM, "maintenance": AGGRESSIVE_MAINTENANCE}
    lake = _use_disk(small_disk, monkeypatch, tmp_path / "dagster", stream, min_free_bytes=0)
    landed = _land_round(lake, 0)
    assert run_lakehouse(["run", "--until-idle"]).returncode == 0
    landed |= _land_round(lake, 1)
    if arguments != RUN_UNTIL_IDLE:  # maintenance: a second commit, so a snapshot expires
        assert run_lakehouse(["run", "--until-idle"]).returncode == 0
    paused = start_paused_at(point, tmp_path / "held", arguments)

    small_disk.fill()
    paused.release()
    code = paused.process.wait(timeout=600)

    output = paused.log.read_text()
    lines = [line for line in output.strip().splitlines() if not line.startswith("Picked up JAVA_")]
    assert code == STORAGE_EXIT_CODE, output[-3000:]
    assert "Traceback" not in output and "Caused by" not in output, output[-3000:]
    assert lines[-1].startswith("lakehouse: ") and str(small_disk.root) in lines[-1], output[-3000:]
    assert "is full" in lines[-1], lines[-1]

    # Once freed, with no operator action: every order once, and every check passes on a table
    # whose files all exist (DuckDB reads every file the table references).
    small_disk.free()
    assert [p.name for p in landing_dir(lake.paths, lake.stream("orders")).iterdir() if p.name.startswith(".")] == []
    for command in (list(arguments), ["run", "--until-idle"]):
        done = run_lakehouse(command)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _committed_ids(lake) == sorted(landed)
    checked = run_lakehouse(["check"])
    assert checked.returncode == 0 and "every blocking check passed" in checked.stdout, checked.stdout


@pytest.mark.spark
def test_the_disk_filled_while_lakehouse_serve_journals_a_request_answers_503_and_the_retry_lands_once(
    small_disk, tmp_path, monkeypatch
):
    stream = {**ORDERS_STREAM, "source": {"landing": {"http": {"tokens": ["t0ken"]}}}}
    lake = _use_disk(small_disk, monkeypatch, tmp_path / "dagster", stream, min_free_bytes=0)
    body = "\n".join(order_event(order_id) for order_id in range(300)) + "\n"
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    held = {faults.PAUSE_ENV: faults.HTTP_BEFORE_JOURNAL, faults.PAUSE_DIR_ENV: str(pauses)}
    server = HttpServer(tmp_path / "serve.log", held).start()
    try:
        with ThreadPoolExecutor(1) as producer:
            # The request's events are written and fsynced; the server is held before its journal.
            answer = producer.submit(_post, server, body, "request-1")
            paused = pauses / f"{faults.HTTP_BEFORE_JOURNAL}.paused"
            deadline = time.monotonic() + 60
            while not paused.exists():
                assert time.monotonic() < deadline and not answer.done(), (tmp_path / "serve.log").read_text()
                time.sleep(0.05)
            small_disk.fill()
            (pauses / f"{faults.HTTP_BEFORE_JOURNAL}.release").touch()
            refused = answer.result(timeout=120)
        assert refused.status_code == 503 and refused.headers.get("Retry-After"), refused.text
        assert f"the file system of {small_disk.root}" in refused.text and "is full" in refused.text, refused.text
        small_disk.free()
        assert _post(server, body, "request-1").status_code == 200  # the producer's retry
    finally:
        assert server.stop() == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert [p.name for p in landing_dir(lake.paths, lake.stream("orders")).iterdir() if p.name.startswith(".")] == []
    assert run_lakehouse(["run", "--until-idle"]).returncode == 0
    assert _committed_ids(Lakehouse.from_env()) == list(range(300))


def test_producers_are_refused_while_sparks_scratch_is_full_on_a_file_system_of_its_own(
    small_disk, tmp_path, monkeypatch
):
    # The lakehouse home on the machine's disk, Spark's scratch on the small one.
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(small_disk.root / "spark-scratch"))
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "lakehouse"))
    document = {"streams": [ORDERS_STREAM], "storage": {"min_free_bytes": 1024 * 1024}}
    write_config(tmp_path, document, monkeypatch)
    events = tmp_path / "events.ndjson"
    events.write_text(order_event(1) + "\n")
    small_disk.fill()

    refused = _one_line(run_lakehouse(["ingest", "--stream", "orders", str(events)]), small_disk)
    assert "Spark's scratch directory" in refused and "nothing was landed" in refused, refused
    status_output = run_lakehouse(["status"]).stdout
    assert f"Spark's scratch {small_disk.root / 'spark-scratch'}: 0 B free" in status_output, status_output

    small_disk.free()
    assert run_lakehouse(["ingest", "--stream", "orders", str(events)]).returncode == 0
