"""Operator mistakes are survivable: each is injected with the real parts (pipeline processes,
Spark, Iceberg tables, Dagster runs and sensors), then the tables are checked against the oracle
of the landing files (``invariants.py``), after the pipeline ran clean and later batches committed."""

import json
import os
import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.storage import tags as dagster_tags

import lakehouse_assets
from lakehouse_assets import faults
from lakehouse_assets.batches.landing import landing_dir, list_landing_files
from lakehouse_assets.batches.ledger import BATCH_FILE, MintedBatch, StreamLedger
from lakehouse_assets.catalog.conditional_commits import set_property_if_unchanged
from lakehouse_assets.catalog.table_metadata import VERSION_HINT
from lakehouse_assets.commit.dead_letters import replayed_keys, sidecar_path
from lakehouse_assets.commit.recovery import CHECKPOINT_PROPERTY, Checkpoint, committed_landing_files, read_checkpoint
from lakehouse_assets.config.loader import load_config
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.defs.sensors import unstaged_batch_request, writer_retry_backoff
from lakehouse_assets.engine.spark import lakehouse_session
from lakehouse_assets.errors import BatchConflictError
from lakehouse_assets.locks import replay_lock_file
from lakehouse_assets.runner import IN_PROCESS_SPARK, run_job, run_until_idle
from lakehouse_assets_tests.fault_injection.invariants import invariant_violations
from lakehouse_assets_tests.fault_injection.pipeline import land_round, run_pipeline, start_lakehouse_process

TABLES = ("sales.orders", "crm.customers")
DEADLINE_SECONDS = 300


def _output(completed) -> str:
    return completed.stdout[-3000:] + completed.stderr[-3000:]


def _run_in_process(config, instance) -> None:
    """``lakehouse run --until-idle`` in this process (its Spark is warm); no run may fail."""
    assert run_until_idle(build_definitions(config), instance, log=lambda _: None).failed == []


def _wait_for(condition, what: str, process=None) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        assert process is None or process.poll() is None, f"the process ended before {what}"
        time.sleep(0.1)


# 1. Half-minted batch ---------------------------------------------------------------------------


@pytest.mark.spark
def test_a_mint_killed_between_its_directory_and_batch_json_is_repaired(lake, instance):
    land_round(lake, 1)

    crashed = run_pipeline({faults.CRASH_ENV: faults.LEDGER_AFTER_DIRECTORY})
    assert crashed.returncode == -signal.SIGKILL, f"never reached the point:\n{_output(crashed)}"
    half_minted = [
        directory
        for stream in lake.config.streams
        for directory in lake.paths.staging(stream.name).iterdir()
        if directory.name.isdigit() and not (directory / BATCH_FILE).exists()
    ]
    assert len(half_minted) == 1

    restarted = run_pipeline()
    assert restarted.returncode == 0, _output(restarted)
    assert (half_minted[0] / BATCH_FILE).exists()  # the sequence was minted into its directory
    land_round(lake, 2)
    _run_in_process(lake.config, instance)

    assert invariant_violations(lake) == []


def test_a_half_minted_directory_is_reused_and_a_minted_batch_is_never_minted_twice(tmp_path):
    ledger = StreamLedger(tmp_path / "orders")
    batch = MintedBatch("orders", 1, "sales.orders", ["a.ndjson"], 10, 0.0, 0.0)
    (tmp_path / "orders" / "0000000001").mkdir(parents=True)  # a mint died after its mkdir
    assert ledger.batches() == []

    ledger.mint(batch)

    assert [record.minted for record in ledger.batches()] == [batch]
    with pytest.raises(BatchConflictError):
        ledger.mint(MintedBatch("orders", 1, "sales.orders", ["b.ndjson"], 10, 0.0, 0.0))
    assert ledger.batch(1).minted == batch


# 2. Missing version-hint.text ------------------------------------------------------------------


@pytest.mark.spark
def test_a_missing_version_hint_finds_the_table_by_listing_and_never_recreates_it(lake):
    before = {identifier: lake.table(identifier).metadata for identifier in TABLES}
    locations = {identifier: lake.metadata_location(identifier) for identifier in TABLES}
    for identifier in TABLES:
        (Path(locations[identifier]).parent / VERSION_HINT).unlink()
        assert lake.metadata_location(identifier) == locations[identifier]
    land_round(lake, 1)

    completed = run_pipeline()

    assert completed.returncode == 0, _output(completed)
    for identifier in TABLES:
        after = lake.table(identifier).metadata
        assert after.table_uuid == before[identifier].table_uuid
        assert {s.snapshot_id for s in before[identifier].snapshots} <= {s.snapshot_id for s in after.snapshots}
        assert after.current_snapshot_id != before[identifier].current_snapshot_id
    assert invariant_violations(lake) == []


# 3. Two `lakehouse dlq replay` at once ----------------------------------------------------------


def _holds_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (Linux ``/proc``: without it the test fails rather than skip)."""
    try:
        descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
    except FileNotFoundError:
        return False
    targets = set()
    for descriptor in descriptors:
        try:
            targets.add(os.readlink(descriptor))
        except FileNotFoundError:
            continue
    return str(path) in targets


@pytest.mark.spark
def test_two_replays_at_once_land_each_dead_letter_once(lake, instance, tmp_path):
    directory = landing_dir(lake.paths, lake.stream("orders"))
    dead_letters = lake.table("sales.orders_dead_letters").scan().to_arrow().to_pylist()
    assert len(dead_letters) == 1
    pause_dir = tmp_path / "pauses"
    pause_dir.mkdir()
    point = faults.REPLAY_AFTER_SELECTING
    replay = ["dlq", "replay", "--table", "sales.orders"]

    # The first replay chose the dead letters and stalls before landing them; the second starts.
    first = start_lakehouse_process(
        replay, {faults.PAUSE_ENV: point, faults.PAUSE_DIR_ENV: str(pause_dir)}, tmp_path / "first.log"
    )
    _wait_for((pause_dir / f"{point}.paused").exists, "the first replay to choose its dead letters", first)
    second = start_lakehouse_process(replay, {}, tmp_path / "second.log")
    lock = replay_lock_file(lake.paths.locks, "orders")
    _wait_for(lambda: _holds_open(second.pid, lock), "the second replay to wait for the replay lock", second)
    assert second.poll() is None and replayed_keys(directory, os.listdir(directory)) == []
    (pause_dir / f"{point}.release").touch()

    assert first.wait(timeout=DEADLINE_SECONDS) == 0, (tmp_path / "first.log").read_text()[-3000:]
    assert second.wait(timeout=DEADLINE_SECONDS) == 0, (tmp_path / "second.log").read_text()[-3000:]
    assert "1 dead letters are in a replay that has not committed yet" in (tmp_path / "second.log").read_text()
    replay_files = [f.name for f in list_landing_files(directory) if sidecar_path(directory / f.name).exists()]
    [key] = replayed_keys(directory, replay_files)
    assert (key.source_file, key.source_line) == (dead_letters[0]["source_file"], dead_letters[0]["source_line"])

    land_round(lake, 1)
    _run_in_process(lake.config, instance)

    # The replayed event failed again: it is a dead letter once, from its replay, with its reason.
    rows = lake.table("sales.orders_dead_letters").scan().to_arrow().to_pylist()
    assert Counter(row["event"] for row in rows).most_common(1)[0][1] == 1
    [replayed] = [row for row in rows if row["event"] == dead_letters[0]["event"]]
    assert replayed["source_file"] == replay_files[0] and replayed["reason"] == dead_letters[0]["reason"]
    assert invariant_violations(lake) == []


# 4. A writer run failed past its retries under the daemon ----------------------------------------


def orders_stage_job() -> dg.JobDefinition:
    """The writer job of ``orders`` (reconstructable, so Dagster can re-execute its failed runs)."""
    return build_definitions(load_config()).resolve_job_def(names.stage_job_name("orders"))


def _landing_tick(config, instance) -> dg.SensorResult:
    """The orders landing sensor evaluated as the daemon evaluates it."""
    defs = build_definitions(config)
    sensor = defs.get_repository_def().get_sensor_def(names.landing_sensor_name("orders"))
    context = dg.build_sensor_context(
        instance=instance, definitions=defs, resources={"lakehouse": LakehouseResource(until_idle=False)}
    )
    return sensor.evaluate_tick(context)


def _launch(instance, request: dg.RunRequest, parent: dg.DagsterRun | None = None) -> dg.DagsterRun:
    """Run ``request`` as the daemon would launch it, or, with ``parent``, as Dagster's run retries
    re-execute a failed run (from failure, with the parent's tags and the next retry number)."""
    job = dg.build_reconstructable_job(__name__, orders_stage_job.__name__)
    tags = {**request.tags, "dagster/run_key": request.run_key, "dagster/sensor_name": "orders_landing_sensor"}
    options = None
    if parent is not None:
        tags[dagster_tags.RETRY_NUMBER_TAG] = str(int(parent.tags.get(dagster_tags.RETRY_NUMBER_TAG, "0")) + 1)
        # As ``create_reexecuted_run`` tags a retry: Dagster counts a run's retries by its root tag.
        tags[dagster_tags.PARENT_RUN_ID_TAG] = parent.run_id
        tags[dagster_tags.ROOT_RUN_ID_TAG] = parent.root_run_id or parent.run_id
        options = dg.ReexecutionOptions.from_failure(parent.run_id, instance)
    run_config = {**request.run_config, "resources": IN_PROCESS_SPARK}
    result = dg.execute_job(job, instance, run_config=run_config, tags=tags, reexecution_options=options)
    return instance.get_run_by_id(result.run_id)


@pytest.mark.spark
def test_a_writer_run_failed_past_its_retries_is_requested_again_after_a_backoff(lake, tmp_path):
    # The project's instance settings: Dagster retries a failed run twice.
    project_settings = Path(lakehouse_assets.__file__).parents[1] / "dagster.yaml"
    shutil.copy(project_settings, Path(os.environ["DAGSTER_HOME"]) / "dagster.yaml")
    land_round(lake, 1)
    landing = landing_dir(lake.paths, lake.stream("orders"))
    claimed = lake.ledger("orders").claimed_files()
    [new_file] = [f.name for f in list_landing_files(landing) if f.name not in claimed]
    aged = time.time() - 120
    os.utime(landing / new_file, (aged, aged))

    with dg.DagsterInstance.get() as instance:
        [request] = _landing_tick(lake.config, instance).run_requests
        assert request.run_key == "orders:2"
        # The batch's landing file is moved away: its writer run and both of Dagster's retries fail.
        (landing / new_file).rename(tmp_path / new_file)
        run = _launch(instance, request)
        for _ in range(2):
            assert run.status == dg.DagsterRunStatus.FAILURE and run.tags[dagster_tags.WILL_RETRY_TAG] == "true"
            run = _launch(instance, request, parent=run)
        assert run.status == dg.DagsterRunStatus.FAILURE and run.tags[dagster_tags.WILL_RETRY_TAG] == "false"

        # The daemon would skip run key orders:2 for ever; the sensor says it backs off instead.
        tick = _landing_tick(lake.config, instance)
        assert tick.run_requests == []
        # The skip reason says why the run failed: the op's error, in one line.
        assert f"writer run {run.run_id} failed: staging__orders_batches: " in tick.skip_message
        assert f"{new_file}; landing files must never be removed before commit; Dagster will not retry it" in (
            tick.skip_message
        )
        assert "requesting the batch again (retry 1) in" in tick.skip_message
        failed_at = instance.get_run_record_by_id(run.run_id).end_time
        minted = lake.ledger("orders").batch(2).minted
        assert unstaged_batch_request(instance, minted, failed_at + 4).request is None
        retry, reason, failed = unstaged_batch_request(instance, minted, failed_at + 5)
        assert failed
        assert retry.run_key == "orders:2:retry-1" and retry.tags[names.WRITER_RETRY_TAG] == "1"
        assert retry.tags[names.WRITER_RETRY_REASON_TAG] == reason and run.run_id in reason

        # The file is back: the new request stages and commits the batch, and later batches commit.
        (tmp_path / new_file).rename(landing / new_file)
        assert _launch(instance, retry).status == dg.DagsterRunStatus.SUCCESS
        assert lake.ledger("orders").batch(2).committed is not None
        land_round(lake, 2)
        _run_in_process(lake.config, instance)

    assert invariant_violations(lake) == []


def test_the_writer_retry_backoff_doubles_up_to_a_minute():
    assert [writer_retry_backoff(retry) for retry in (1, 2, 3, 4, 5, 6, 7)] == [5, 10, 20, 40, 60, 60, 60]


def test_the_dagster_run_tags_the_sensor_reads_are_dagsters_own():
    assert names.WILL_RETRY_TAG == dagster_tags.WILL_RETRY_TAG
    assert names.RETRY_NUMBER_TAG == dagster_tags.RETRY_NUMBER_TAG
    assert names.MAX_RETRIES_TAG == dagster_tags.MAX_RETRIES_TAG


# 5. A wiped staging ledger -----------------------------------------------------------------------


def _wipe_ledgers(lake) -> None:
    for stream in lake.config.streams:
        shutil.rmtree(lake.paths.staging(stream.name))


@pytest.mark.spark
@pytest.mark.second_round  # rounds 0 and 1 committed before the wipe (``conftest.py``)
def test_a_wiped_staging_ledger_batches_no_committed_landing_file_again(lake, instance):
    _wipe_ledgers(lake)
    land_round(lake, 2)
    _run_in_process(lake.config, instance)

    assert invariant_violations(lake) == []
    for stream in lake.config.streams:
        table = lake.table(stream.table_identifier)
        landed = {f.name for f in list_landing_files(landing_dir(lake.paths, stream))}
        assert committed_landing_files(table, stream.name) == landed


@pytest.mark.spark
@pytest.mark.second_round  # rounds 0 and 1 committed before the maintenance (``conftest.py``)
def test_a_ledger_wiped_after_expiry_batches_no_landing_file_again(lake, instance):
    repository = build_definitions(lake.config).get_repository_def()
    for identifier in TABLES:
        assert run_job(repository.get_job(names.maintenance_job_name(identifier)), instance).success
    land_round(lake, 2)
    _run_in_process(lake.config, instance)
    # The first rounds' commits expired: only the checkpoint names their landing files now.
    for stream in lake.config.streams:
        table = lake.table(stream.table_identifier)
        assert CHECKPOINT_PROPERTY in table.metadata.properties
        assert len(read_checkpoint(table.metadata).landing_files[stream.name]) >= 1
        assert min(s.sequence_number for s in table.metadata.snapshots) > 1

    _wipe_ledgers(lake)
    land_round(lake, 3)
    _run_in_process(lake.config, instance)

    assert invariant_violations(lake) == []
    assert json.loads(lake.table("sales.orders").current_snapshot().summary["lakehouse.landing-files"])


@pytest.mark.spark
def test_the_checkpoint_keeps_any_landing_file_name_and_is_never_written_onto_a_newer_version(lake):
    odd_names = ["o'brien.ndjson", "back\\slash\\u0041.ndjson", 'caf\u00e9 "quoted".ndjson', "line\nbreak.ndjson"]
    text = Checkpoint(1, {"orders": 1}, landing_files={"orders": odd_names}).to_json()
    spark, read = lakehouse_session(lake), lake.table("sales.orders")

    assert set_property_if_unchanged(spark, "sales.orders", read.metadata_location, CHECKPOINT_PROPERTY, text)
    assert read_checkpoint(lake.table("sales.orders").metadata).landing_files == {"orders": odd_names}
    # Decided from the version before that write, the same write is refused and changes nothing.
    stale = Checkpoint(1, {"orders": 1}).to_json()
    assert not set_property_if_unchanged(spark, "sales.orders", read.metadata_location, CHECKPOINT_PROPERTY, stale)
    assert read_checkpoint(lake.table("sales.orders").metadata).landing_files == {"orders": odd_names}
