"""Micro-batch decisions, with the real sensors evaluated by ``dg.build_sensor_context`` (no Spark)."""

import os
import time

import dagster as dg

from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.config.spec import FlushSpec
from lakehouse_assets.definitions import build_definitions
from lakehouse_assets.defs import names
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.defs.sensors import committer_backoff, landing_sensor_interval
from lakehouse_assets_tests.conftest import order_event


def _tick(config, instance, sensor_name, cursor=None, until_idle=False):
    defs = build_definitions(config)
    sensor = defs.get_repository_def().get_sensor_def(sensor_name)
    context = dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        definitions=defs,
        resources={"lakehouse": LakehouseResource(until_idle=until_idle)},
    )
    return sensor.evaluate_tick(context)


def test_landing_sensor_waits_and_says_why(lake, instance):
    land_events(lake.paths, lake.stream("orders"), [order_event(i) for i in range(10)])
    tick = _tick(lake.config, instance, names.landing_sensor_name("orders"))
    assert tick.run_requests == []
    assert "bytes in 1 files pending (< flush.max_bytes 1000000)" in tick.skip_message
    assert "(< flush.max_age 60s)" in tick.skip_message
    assert lake.ledger("orders").batches() == []


def test_age_trigger_mints_a_batch_with_exact_files(lake, instance):
    landed = land_events(lake.paths, lake.stream("orders"), [order_event(i) for i in range(10)])
    old = time.time() - 120
    os.utime(landed[0], (old, old))
    tick = _tick(lake.config, instance, names.landing_sensor_name("orders"))
    [request] = tick.run_requests
    assert request.run_key == "orders:1"
    op_config = request.run_config["ops"][names.staged_batches_op("orders")]["config"]
    assert op_config == {"sequence": 1, "files": [landed[0].name]}
    assert tick.cursor == "1"


def test_bytes_trigger_cuts_batches_of_at_most_max_bytes(lake, instance):
    stream = lake.stream("orders")
    big_line = order_event(1, note="x" * 400_000)
    for _ in range(3):
        land_events(lake.paths, stream, [big_line])
    tick = _tick(lake.config, instance, names.landing_sensor_name("orders"))
    assert [r.run_key for r in tick.run_requests] == ["orders:1"]
    minted = lake.ledger("orders").batches()
    assert [len(r.minted.files) for r in minted] == [2]


def test_unstaged_batches_are_requested_again_under_the_same_run_key(lake, instance):
    land_events(lake.paths, lake.stream("orders"), [order_event(1)])
    first = _tick(lake.config, instance, names.landing_sensor_name("orders"), until_idle=True)
    again = _tick(lake.config, instance, names.landing_sensor_name("orders"), cursor=None)
    assert [r.run_key for r in first.run_requests] == ["orders:1"]
    assert [r.run_key for r in again.run_requests] == ["orders:1"]
    assert len(lake.ledger("orders").batches()) == 1


def test_a_batch_whose_writer_run_is_in_progress_is_named_on_the_tick_instead_of_requested(lake, instance):
    old = time.time() - 120
    landed = land_events(lake.paths, lake.stream("orders"), [order_event(1)])
    os.utime(landed[0], (old, old))
    [request] = _tick(lake.config, instance, names.landing_sensor_name("orders")).run_requests
    run = instance.create_run_for_job(dg.GraphDefinition("orders_stage_job").to_job(), tags=request.tags)
    instance.report_dagster_event(
        dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_START.value, job_name=run.job_name), run.run_id
    )

    tick = _tick(lake.config, instance, names.landing_sensor_name("orders"), cursor="1")

    assert tick.run_requests == []
    assert tick.skip_message == f"batch orders:1 waits for writer run {run.run_id} (STARTED)"


def test_commit_sensor_skips_without_staged_batches(config, instance):
    tick = _tick(config, instance, names.staged_sensor_name("sales.orders"))
    assert tick.skip_message == "no staged batches are ready to commit"


def test_no_new_batch_is_cut_while_one_waits_for_its_writer(lake, instance):
    stream = lake.stream("orders")
    old = time.time() - 120
    first = land_events(lake.paths, stream, [order_event(1)])
    os.utime(first[0], (old, old))
    [request] = _tick(lake.config, instance, names.landing_sensor_name("orders")).run_requests

    second = land_events(lake.paths, stream, [order_event(2)])
    os.utime(second[0], (old, old))
    again = _tick(lake.config, instance, names.landing_sensor_name("orders"), cursor="1")

    # Batch 1 is asked for again under its run key; the aged file waits for the next batch.
    assert [r.run_key for r in again.run_requests] == [request.run_key] == ["orders:1"]
    assert [r.minted.files for r in lake.ledger("orders").batches()] == [[first[0].name]]


def test_the_landing_sensor_ticks_at_a_third_of_max_age_within_bounds(config):
    intervals = {
        age: landing_sensor_interval(config.stream("orders").model_copy(update={"flush": FlushSpec(max_age=age)}))
        for age in (1.0, 15.0, 60.0, 3600.0)
    }
    assert intervals == {1.0: 5, 15.0: 5, 60.0: 20, 3600.0: 30}


def _failed_run(instance: dg.DagsterInstance, job_name: str) -> dg.DagsterRun:
    run = instance.create_run_for_job(dg.GraphDefinition(job_name).to_job())
    instance.report_run_failed(run, message="injected")
    return run


def test_a_committer_that_keeps_failing_is_requested_again_after_a_doubling_backoff(instance):
    job = names.commit_job_name("sales.orders")
    assert committer_backoff(instance, job) is None

    _failed_run(instance, job)
    once = time.time()
    assert "the last 1 runs" in committer_backoff(instance, job, now=once + 1)
    assert committer_backoff(instance, job, now=once + 6) is None  # 5 s after one failure
    _failed_run(instance, job)
    twice = time.time()
    assert "the last 2 runs" in committer_backoff(instance, job, now=twice + 6)
    assert committer_backoff(instance, job, now=twice + 11) is None  # 10 s after two
    succeeded = instance.create_run_for_job(dg.GraphDefinition(job).to_job())
    instance.report_dagster_event(
        dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_SUCCESS.value, job_name=job), succeeded.run_id
    )
    assert committer_backoff(instance, job, now=twice + 1) is None, "a success ends the backoff"
