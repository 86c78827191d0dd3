"""Attached ``lakehouse`` processes forked from a server that imported the package once.

An attached process (``attached_cli``) is a real process of its own, killed or held at a fault
point for real, whose Spark is the test worker's warm JVM. Started as ``python -m``, each one
first imports Dagster, PySpark and the package: about 1.7 CPU-seconds on 2 cores, as much as the
rest of its work (``docs/benchmarks.md``). So these processes are forked instead from
multiprocessing's fork server, which imports them once per test worker; each child then takes the
environment and the output files it is given and runs ``attached_cli`` as ``python -m`` would.
What it proves is unchanged: it has its own process id, locks, Dagster runs and liveness locks,
and dies alone at the fault point.

The processes a test starts cold (a JVM of their own) are never forked: they start as a user
starts ``lakehouse``.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_SERVER = multiprocessing.get_context("forkserver")
# What the server imports before it forks: what an attached ``lakehouse`` process imports.
_SERVER.set_forkserver_preload(
    [
        "lakehouse_assets_tests.fault_injection.attached_cli",
        "lakehouse_assets.cli.main",
        "lakehouse_assets.cli.commands",
        "lakehouse_assets.definitions",
        "lakehouse_assets.runner",
        "pyspark.sql",
        # What the child's first ``DagsterInstance.get()`` imports (its storages, the daemon's
        # settings): about 0.4 CPU-seconds a child otherwise.
        "dagster._core.instance.factory",
        "dagster._core.storage.root",
        "dagster._core.storage.sqlite_storage",
        "dagster._daemon.controller",
        "upath.implementations.local",
    ]
)


def _run_attached_cli(arguments: list[str], env: dict[str, str], stdout: str, stderr: str) -> None:
    """In the forked child: ``python -m attached_cli <arguments>`` with ``env`` and its output in
    the two files."""
    from lakehouse_assets_tests.fault_injection import attached_cli

    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = [attached_cli.__file__, *arguments]
    attached_cli.main()


class ForkedProcess:
    """A forked attached process, with the part of ``subprocess.Popen`` the fault tests use."""

    def __init__(self, arguments: list[str], env: dict[str, str], stdout: Path, stderr: Path) -> None:
        self.args = arguments
        self._process = _SERVER.Process(target=_run_attached_cli, args=(arguments, env, str(stdout), str(stderr)))
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        """The exit code, or minus the signal that ended it (as ``Popen``); None while it runs."""
        return self._process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()


def start_forked(arguments: list[str], env: dict[str, str], log: Path) -> ForkedProcess:
    """Start ``attached_cli <arguments>`` forked, both its outputs going to ``log`` (emptied first)."""
    log.write_text("")
    return ForkedProcess(arguments, env, log, log)


def run_forked(arguments: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run ``attached_cli <arguments>`` forked, as ``subprocess.run`` with ``capture_output``."""
    with tempfile.TemporaryDirectory(prefix="attached-") as outputs:
        stdout, stderr = Path(outputs) / "stdout", Path(outputs) / "stderr"
        process = ForkedProcess(arguments, env, stdout, stderr)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        return subprocess.CompletedProcess(arguments, code, _read(stdout), _read(stderr))


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
