"""A two-stream pipeline for fault tests, its events, and the pipeline run as a real process.

``orders`` appends to ``sales.orders``; ``customers`` applies changes to ``crm.customers``. Every
round lands new events in both, including one event per stream that must be dead-lettered.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

from lakehouse_assets import faults
from lakehouse_assets.batches.landing import land_events
from lakehouse_assets.cli import main as cli
from lakehouse_assets.config.loader import CONFIG_ENV, load_config
from lakehouse_assets.engine.spark import jvm_session
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.paths import HOME_ENV, STORAGE_ROOT_ENV
from lakehouse_assets_tests.fault_injection.forked_processes import ForkedProcess, run_forked, start_forked
from lakehouse_assets_tests.postgres_server import TEST_JVM_CLASS_PATH_ENV

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
FAULT_ENVS = (faults.CRASH_ENV, faults.FAIL_ENV, faults.PAUSE_ENV)
# What a command run in this process may be given: other homes and storage root (a second host).
IN_PROCESS_ENVS = {HOME_ENV, "DAGSTER_HOME", CONFIG_ENV, STORAGE_ROOT_ENV}
Completed = subprocess.CompletedProcess


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


def run_pipeline(extra_env: dict[str, str] | None = None, timeout: float = 600, cold: bool = False) -> Completed:
    """``lakehouse run --until-idle`` with this test's homes and config, as :func:`run_lakehouse`."""
    return run_lakehouse(list(RUN_UNTIL_IDLE), extra_env, timeout, cold)


def run_lakehouse(
    arguments: list[str], extra_env: dict[str, str] | None = None, timeout: float = 600, cold: bool = False
) -> Completed:
    """``lakehouse <arguments>`` with this test's homes and config (and ``extra_env``).

    A process of its own that starts its own JVM when it needs one (a Spark master) or is ``cold``
    (:func:`lakehouse_process_command`); one attached to this worker's warm JVM, forked from the
    fork server (``forked_processes``), when it is to be killed or held at a fault point.
    Otherwise the same command runs in this test process, on its warm JVM: that is what a restart
    after a kill, or a second host sharing only the catalog and the storage, needs to prove, and it
    costs seconds instead of a cold start. Locks still exclude each other: each is a process's own.
    """
    env = {**os.environ, **(extra_env or {})}
    if cold or _needs_own_jvm(extra_env):
        command, process_environment = lakehouse_process_command(arguments, extra_env)
        return subprocess.run(
            command, env=process_environment, capture_output=True, text=True, timeout=timeout, check=False
        )
    if any(name in env for name in FAULT_ENVS):
        return run_forked(arguments, attached_process_env(extra_env), timeout)
    return run_lakehouse_in_this_process(arguments, extra_env or {})


def _needs_own_jvm(extra_env: dict[str, str] | None) -> bool:
    """Whether ``extra_env`` sets more than homes, a config and fault points (a Spark master, say)."""
    return bool(set(extra_env or {}) - IN_PROCESS_ENVS - set(FAULT_ENVS) - {faults.PAUSE_DIR_ENV})


def lakehouse_process_command(
    arguments: list[str], extra_env: dict[str, str] | None
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a ``lakehouse <arguments>`` process that starts a JVM of
    its own, as a user runs it: a cold process (each family of fault points keeps one), or one
    whose settings need a JVM of its own (a Spark master)."""
    return [sys.executable, "-m", "lakehouse_assets.cli.main", *arguments], process_env(extra_env)


def attached_process_env(extra_env: dict[str, str] | None) -> dict[str, str]:
    """The environment of an attached process (``forked_processes``): its Spark is this worker's
    warm JVM; it is still a process of its own, killed or held for real, without paying for a
    JVM's start."""
    return process_env(extra_env) | worker_gateway_env()


def worker_gateway_env() -> dict[str, str]:
    """The environment that points PySpark at this worker's JVM (started now if it is not yet)."""
    from pyspark import SparkContext

    jvm_session(load_config())
    parameters = SparkContext._gateway.gateway_parameters  # type: ignore[union-attr]
    return {"PYSPARK_GATEWAY_PORT": str(parameters.port), "PYSPARK_GATEWAY_SECRET": parameters.auth_token}


def run_lakehouse_in_this_process(arguments: list[str], extra_env: dict[str, str]) -> Completed:
    """``lakehouse <arguments>`` in this process with ``extra_env`` set, reported as its process
    would: its exit code and output, and 1 with a traceback when an error escapes."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as monkeypatch, redirect_stdout(stdout), redirect_stderr(stderr):
        for name, value in extra_env.items():
            monkeypatch.setenv(name, value)
        try:
            code = cli.main(arguments)
        except Exception:  # noqa: BLE001 - as an uncaught error ends the command's process
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess(arguments, code, stdout.getvalue(), stderr.getvalue())


def process_env(extra_env: dict[str, str] | None) -> dict[str, str]:
    """The environment of a ``lakehouse`` process a test starts: the test's, without the JDBC
    driver this test process's JVM was given (a process with a JVM of its own has only what its
    config gives it), plus ``extra_env``."""
    env = {name: value for name, value in os.environ.items() if name != TEST_JVM_CLASS_PATH_ENV}
    return env | (extra_env or {})


def kill_at_then_restart(point: str, cold: bool = False) -> None:
    """Run the pipeline until it is killed (SIGKILL) at fault point ``point``, then run it again to
    the end in this process. ``cold``, the killed process starts a JVM of its own, which the kill
    ends too; the restart still runs on this worker's warm JVM, which never saw the killed process,
    as a run after a crash does on a long-running Spark host (a cold restart would cost a JVM's
    start and prove nothing more). Fails when the point is never reached or the restart fails."""
    crashed = run_pipeline({faults.CRASH_ENV: point}, cold=cold)
    assert crashed.returncode == -signal.SIGKILL, f"never reached {point}:\n{crashed.stdout[-3000:]}"
    restarted = run_pipeline()
    assert restarted.returncode == 0, restarted.stdout[-3000:] + restarted.stderr[-3000:]


def start_pipeline_process(
    extra_env: dict[str, str], log: Path, cold: bool = False
) -> subprocess.Popen | ForkedProcess:
    """Start ``lakehouse run --until-idle`` without waiting; output goes to ``log``."""
    return start_lakehouse_process(list(RUN_UNTIL_IDLE), extra_env, log, cold)


@dataclass
class PausedProcess:
    """A ``lakehouse`` process held at a fault point until :meth:`release`; its output in ``log``."""

    process: subprocess.Popen | ForkedProcess
    log: Path
    release_file: Path

    def release(self) -> None:
        self.release_file.touch()


def start_paused_at(point: str, work: Path, arguments: tuple[str, ...] = RUN_UNTIL_IDLE) -> PausedProcess:
    """``lakehouse <arguments>`` (the pipeline unless told) started; returns once it is held at
    fault point ``point``."""
    pauses = work / "pauses"
    pauses.mkdir(parents=True, exist_ok=True)
    log = work / "paused-process.log"
    pause_env = {faults.PAUSE_ENV: point, faults.PAUSE_DIR_ENV: str(pauses)}
    process = start_lakehouse_process(list(arguments), pause_env, log)
    deadline = time.monotonic() + faults.PAUSE_TIMEOUT_SECONDS
    while not (pauses / f"{point}.paused").exists():
        assert time.monotonic() < deadline and process.poll() is None, (
            f"never paused at {point}:\n{log.read_text()[-3000:]}"
        )
        time.sleep(0.2)
    return PausedProcess(process, log, pauses / f"{point}.release")


@contextmanager
def lakehouse_paused_at(point: str, work: Path, arguments: tuple[str, ...] = RUN_UNTIL_IDLE) -> Iterator[Path]:
    """``lakehouse <arguments>`` held at fault point ``point`` while the block runs, then released;
    the block gets the process's log, and the process must end successfully."""
    paused = start_paused_at(point, work, arguments)
    try:
        yield paused.log
    finally:
        paused.release()
    assert paused.process.wait(timeout=600) == 0, paused.log.read_text()[-3000:]


def assert_publish_refused(paused_log: Path, other_host: subprocess.CompletedProcess) -> None:
    """The paused host's log says the catalog refused its publish (another committer published
    first); when it does not, both hosts' output, to tell a race the test lost from a missing fence."""
    log = paused_log.read_text()
    assert "another committer published" in log, f"host A:\n{log[-3000:]}\nhost B:\n{other_host.stdout[-3000:]}"


def start_lakehouse_process(
    arguments: list[str], extra_env: dict[str, str], log: Path, cold: bool = False
) -> subprocess.Popen | ForkedProcess:
    """Start ``lakehouse <arguments>`` without waiting, cold or attached (see :func:`run_lakehouse`);
    output goes to ``log``."""
    if not (cold or _needs_own_jvm(extra_env)):
        return start_forked(list(arguments), attached_process_env(extra_env), log)
    command, process_environment = lakehouse_process_command(arguments, extra_env)
    handle = open(log, "w")  # noqa: SIM115 - closed by the process's end
    return subprocess.Popen(command, env=process_environment, stdout=handle, stderr=subprocess.STDOUT, text=True)


def run_two_pipelines_at_once(logs: Path, cold: bool = True) -> None:
    """Run two ``lakehouse run --until-idle`` at once (both must succeed), then one more: a
    committer fenced by the other leaves its batches for the next pass. ``cold``, each has a JVM
    of its own, as two hosts do: on the Hadoop catalog they must (attached to one JVM, their
    commits would wait on one in-memory lock); on a catalog that decides by compare-and-swap
    (JDBC, REST) both can be attached to this worker's JVM, where nothing else orders them."""
    first = start_pipeline_process({}, logs / "first.log", cold=cold)
    second = start_pipeline_process({}, logs / "second.log", cold=cold)
    assert first.wait(timeout=600) == 0, (logs / "first.log").read_text()[-3000:]
    assert second.wait(timeout=600) == 0, (logs / "second.log").read_text()[-3000:]
    assert run_pipeline().returncode == 0
