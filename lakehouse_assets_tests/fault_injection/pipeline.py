"""A two-stream pipeline for fault tests, its events, and the pipeline run as a real process.

``orders`` appends to ``sales.orders``; ``customers`` applies changes to ``crm.customers``. Every
round lands new events in both, including one event per stream that must be dead-lettered.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lakehouse_assets import faults
from lakehouse_assets.catalog.table_metadata import is_hadoop_catalog
from lakehouse_assets.catalog.tables import require_static_tables
from lakehouse_assets.config import load_config
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.ingest.landing import land_events
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.runner import dagster_instance, run_pipeline_until_idle

ORDERS = {
    "name": "orders",
    "table_identifier": "sales.orders",
    "auto_create": True,
    "schema": {
        "columns": [
            {"name": "order_id", "type": "long", "required": True},
            {"name": "customer_id", "type": "long"},
            {"name": "amount", "type": "double"},
        ]
    },
    "table_properties": {"format-version": "2"},
    "flush": {"max_bytes": 100_000, "max_age": "60s"},
    "commit_interval": "0s",
}
CUSTOMERS = {
    "name": "customers",
    "table_identifier": "crm.customers",
    "auto_create": True,
    "operation": "${/op}",
    "identifier_columns": ["id"],
    "schema": {
        "columns": [
            {"name": "id", "type": "long", "required": True},
            {"name": "name", "type": "string"},
        ],
        "partition_spec": [{"column": "id", "transform": "bucket[2]"}],
    },
    "table_properties": {"format-version": "2"},
    "flush": {"max_bytes": 100_000, "max_age": "60s"},
    "commit_interval": "0s",
}
# Maintenance runs only when a test asks; then it expires everything but the last two snapshots
# and compacts as soon as two files exist.
AGGRESSIVE_MAINTENANCE = {
    "schedule": None,
    "compaction": {"min_input_files": 2},
    "expire_snapshots": {"older_than": "0s", "retain_last": 2},
    "remove_orphan_files": {"older_than": "1m"},
}
PIPELINE = {"streams": [{**stream, "maintenance": AGGRESSIVE_MAINTENANCE} for stream in (ORDERS, CUSTOMERS)]}
OPERATIONS = ("c", "u", "d", "u", "c")
RUN_UNTIL_IDLE = ("run", "--until-idle")


def land_round(lake: Lakehouse, round_number: int) -> None:
    """Land one round of events: 30 orders and 15 customer changes, each with one bad event."""
    first = round_number * 30
    orders = [json.dumps({"order_id": first + i, "customer_id": i % 7, "amount": i * 0.5}) for i in range(30)]
    orders.append(json.dumps({"customer_id": round_number, "note": f"round {round_number}: no order_id"}))
    land_events(lake.paths, lake.stream("orders"), orders)
    changes = [
        json.dumps(
            {"op": OPERATIONS[(first + i) % len(OPERATIONS)], "id": (first + i * 3) % 11, "name": f"n{first + i}"}
        )
        for i in range(15)
    ]
    changes.append(json.dumps({"op": "merge", "id": 1, "note": f"round {round_number}: unknown operation"}))
    land_events(lake.paths, lake.stream("customers"), changes)


def remove_staged_parquet(lake: Lakehouse) -> None:
    """Remove the staged Parquet of every committed batch, as the next committer pass does."""
    for stream in lake.config.streams:
        ledger = lake.ledger(stream.name)
        for record in ledger.batches():
            if record.committed:
                ledger.remove_attempts(record.sequence)


def run_pipeline_process(
    extra_env: dict[str, str] | None = None, timeout: float = 600, cold: bool = False
) -> subprocess.CompletedProcess:
    """``lakehouse run --until-idle`` with this test's homes and config: as a separate process when
    it is to be killed, held or given another environment (``extra_env``), or ``cold`` (each family
    of fault points keeps one cold restart); otherwise the same runs in this test process, on its
    warm JVM, which is what a restart after a kill needs to prove and costs seconds instead of a
    cold start (a process of its own, as the killed one was, so locks still exclude each other)."""
    fault_armed = any(name in os.environ for name in (faults.CRASH_ENV, faults.FAIL_ENV, faults.PAUSE_ENV))
    if cold or extra_env or fault_armed or not is_hadoop_catalog(load_config().catalog):
        # Another catalog may need jars this worker's JVM was started without (a JDBC driver).
        return run_lakehouse_process(list(RUN_UNTIL_IDLE), extra_env, timeout)
    return run_pipeline_in_this_process()


def run_pipeline_in_this_process() -> subprocess.CompletedProcess:
    """What ``lakehouse run --until-idle`` does, in this process, reported as its process would:
    exit code 1 when a run failed or an error escaped (a traceback), 2 with the one-line message
    for the package's own errors."""
    lines: list[str] = []
    arguments = list(RUN_UNTIL_IDLE)
    try:
        lake = Lakehouse.from_env()
        require_static_tables(lake)
        with dagster_instance(lake.paths) as instance:
            report = run_pipeline_until_idle(instance, log=lines.append)
    except LakehouseError as error:
        return subprocess.CompletedProcess(arguments, 2, "\n".join(lines), f"lakehouse: {error}")
    except Exception:  # noqa: BLE001 - as an uncaught error ends the command's process
        return subprocess.CompletedProcess(arguments, 1, "\n".join(lines), traceback.format_exc())
    lines.append(f"idle: {len(report.succeeded)} runs succeeded, {len(report.failed)} failed")
    return subprocess.CompletedProcess(arguments, 1 if report.failed else 0, "\n".join(lines), "")


def run_lakehouse_process(
    arguments: list[str], extra_env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``lakehouse <arguments>`` as a separate process with this test's homes and config."""
    env = {**os.environ, **(extra_env or {})}
    return subprocess.run(
        [sys.executable, "-m", "lakehouse_assets.cli", *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def kill_at_then_restart(point: str, cold_restart: bool = False) -> None:
    """Run the pipeline until it is killed (SIGKILL) at fault point ``point``, then run it again to
    the end (in this process unless ``cold_restart``); fails when the point is never reached or the
    restart fails."""
    crashed = run_pipeline_process({faults.CRASH_ENV: point})
    assert crashed.returncode == -signal.SIGKILL, f"never reached {point}:\n{crashed.stdout[-3000:]}"
    restarted = run_pipeline_process(cold=cold_restart)
    assert restarted.returncode == 0, restarted.stdout[-3000:] + restarted.stderr[-3000:]


def start_pipeline_process(extra_env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start ``lakehouse run --until-idle`` without waiting; output goes to ``log``."""
    return start_lakehouse_process(list(RUN_UNTIL_IDLE), extra_env, log)


@contextmanager
def lakehouse_paused_at(point: str, work: Path, arguments: tuple[str, ...] = RUN_UNTIL_IDLE) -> Iterator[Path]:
    """``lakehouse <arguments>`` (the pipeline unless told) started and held at fault point
    ``point`` while the block runs, then released; the block gets the process's log, and the
    process must end successfully."""
    pauses = work / "pauses"
    pauses.mkdir(parents=True, exist_ok=True)
    log = work / "paused-process.log"
    paused = start_lakehouse_process(list(arguments), {faults.PAUSE_ENV: point, faults.PAUSE_DIR_ENV: str(pauses)}, log)
    deadline = time.monotonic() + faults.PAUSE_TIMEOUT_SECONDS
    while not (pauses / f"{point}.paused").exists():
        assert time.monotonic() < deadline and paused.poll() is None, (
            f"never paused at {point}:\n{log.read_text()[-3000:]}"
        )
        time.sleep(0.2)
    try:
        yield log
    finally:
        (pauses / f"{point}.release").touch()
    assert paused.wait(timeout=600) == 0, log.read_text()[-3000:]


def start_lakehouse_process(arguments: list[str], extra_env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start ``lakehouse <arguments>`` without waiting; output goes to ``log``."""
    handle = open(log, "w")  # noqa: SIM115 - closed by the process's end
    return subprocess.Popen(
        [sys.executable, "-m", "lakehouse_assets.cli", *arguments],
        env={**os.environ, **extra_env},
        stdout=handle,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_two_pipelines_at_once(logs: Path) -> None:
    """Run two ``lakehouse run --until-idle`` at once (both must succeed), then one more: a
    committer fenced by the other leaves its batches for the next pass."""
    first = start_pipeline_process({}, logs / "first.log")
    second = start_pipeline_process({}, logs / "second.log")
    assert first.wait(timeout=600) == 0, (logs / "first.log").read_text()[-3000:]
    assert second.wait(timeout=600) == 0, (logs / "second.log").read_text()[-3000:]
    assert run_pipeline_process().returncode == 0
