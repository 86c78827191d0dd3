"""A throwaway Spark standalone cluster on this machine: one master and one worker.

Both are started from the pyspark package's own launcher (``<pyspark>/bin/spark-class``) on the
Java the project picks (``ensure_java_home``), bound to 127.0.0.1 on free ports, with their logs,
work and scratch directories under a directory the caller owns. Nothing is read from or written
to the package directory, and a ``SPARK_HOME`` or ``SPARK_CONF_DIR`` of the caller's environment is
ignored, so the cluster runs exactly the Spark the project depends on.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyspark

from lakehouse_assets.jvm.java_runtime import ensure_java_home

LOOPBACK = "127.0.0.1"
START_TIMEOUT_SECONDS = 90.0
STOP_TIMEOUT_SECONDS = 20.0
APP_POLL_SECONDS = 30.0
POLL_SECONDS = 0.5
DAEMON_MEMORY = "256m"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class SparkClusterError(RuntimeError):
    """The standalone cluster did not start; the message carries the reason and the log tails."""


@dataclass(frozen=True)
class StandaloneCluster:
    """A running master and worker: where to submit, where to look."""

    master_url: str
    """``spark://127.0.0.1:<port>``, the driver's ``spark.master``."""
    master_web_url: str
    """The master's web UI; ``<master_web_url>/json/`` describes workers and applications."""
    work_dir: Path
    """The worker's work directory: one ``app-*`` directory per application it ran executors for."""
    log_dir: Path

    def state(self) -> dict:
        """The master's JSON state: ``aliveworkers``, ``activeapps``, ``completedapps``, ..."""
        return _master_state(self.master_web_url)

    def application_dirs(self) -> list[Path]:
        """The work directories of the applications whose executors ran on the worker."""
        return sorted(self.work_dir.glob("app-*"))

    def completed_app_names(self) -> list[str]:
        """The names of the completed applications, once none is active (the master lists an
        application as completed once its driver has gone away) or after ``APP_POLL_SECONDS``."""
        deadline = time.monotonic() + APP_POLL_SECONDS
        while True:
            state = self.state()
            if not state.get("activeapps") or time.monotonic() > deadline:
                return [app["name"] for app in state.get("completedapps", [])]
            time.sleep(POLL_SECONDS)


def pyspark_home() -> Path:
    """The pyspark package directory, which is a complete Spark distribution (``bin``, ``jars``)."""
    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def cluster_environment(base: Path) -> dict[str, str]:
    """The environment for the master, the worker and the drivers that use them: the project's
    Java, the package's Spark, loopback only, small daemons, scratch space under ``base``."""
    conf_dir = base / "conf"
    local_dir = base / "local"
    conf_dir.mkdir(parents=True, exist_ok=True)
    local_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        {
            "JAVA_HOME": ensure_java_home(),
            "SPARK_HOME": str(pyspark_home()),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": LOOPBACK,
            "SPARK_LOCAL_DIRS": str(local_dir),
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_MASTER_HOST": LOOPBACK,
            "SPARK_WORKER_DIR": str(base / "work"),
        }
    )
    for unwanted in ("SPARK_MASTER_OPTS", "SPARK_WORKER_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
        env.pop(unwanted, None)
    return env


def _master_state(web_url: str) -> dict:
    with urllib.request.urlopen(f"{web_url}/json/", timeout=5) as response:
        return json.load(response)


def _tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return f"({path} missing)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def _daemon(name: str, arguments: list[str], env: dict[str, str], log_dir: Path) -> Iterator[subprocess.Popen]:
    """Run ``spark-class <arguments>`` (which execs the JVM, so its pid is the daemon's) in its
    own process group, logging to ``<log_dir>/<name>.log``; stop it by pid at exit."""
    log_path = log_dir / f"{name}.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [str(pyspark_home() / "bin" / "spark-class"), *arguments],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        _stop(process)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the daemon's process group (a worker's executors shut down with it), then SIGKILL
    whatever is left after the timeout."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            # The daemon is gone; an executor it launched may still be exiting in its group.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return


def _wait_for_worker(web_url: str, daemons: dict[str, subprocess.Popen], log_dir: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        for name, process in daemons.items():
            if process.poll() is not None:
                raise SparkClusterError(
                    f"the Spark {name} exited with code {process.returncode}:\n{_tail(log_dir / f'{name}.log')}"
                )
        try:
            if _master_state(web_url).get("aliveworkers", 0) >= 1:
                return
            last_error = "the master answers but no worker is alive"
        except (OSError, ValueError) as error:  # not listening yet, or a half-written answer
            last_error = str(error)
        time.sleep(POLL_SECONDS)
    logs = "\n".join(f"--- {name}.log\n{_tail(log_dir / f'{name}.log')}" for name in daemons)
    raise SparkClusterError(
        f"no worker registered with the Spark master within {START_TIMEOUT_SECONDS:.0f}s ({last_error})\n{logs}"
    )


@contextmanager
def standalone_cluster(base: Path, cores: int = 1, memory: str = "1g") -> Iterator[StandaloneCluster]:
    """Start a master and one worker (``cores``, ``memory``) under ``base``, wait until the worker
    has registered, and yield the cluster; both daemons are stopped by pid at exit, whatever
    happened.

    Raises:
        SparkClusterError: a daemon exited or the worker did not register in time; the message
            includes the tails of their logs.
    """
    base.mkdir(parents=True, exist_ok=True)
    log_dir, work_dir = base / "logs", base / "work"
    log_dir.mkdir(exist_ok=True)
    work_dir.mkdir(exist_ok=True)
    env = cluster_environment(base)
    port, web_port, worker_web_port = free_port(), free_port(), free_port()
    master_url, web_url = f"spark://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{web_port}"
    with ExitStack() as stack:
        master = stack.enter_context(
            _daemon(
                "master",
                [MASTER_CLASS, "--host", LOOPBACK, "--port", str(port), "--webui-port", str(web_port)],
                env,
                log_dir,
            )
        )
        worker = stack.enter_context(
            _daemon(
                "worker",
                [
                    WORKER_CLASS,
                    master_url,
                    "--host",
                    LOOPBACK,
                    "--webui-port",
                    str(worker_web_port),
                    "--cores",
                    str(cores),
                    "--memory",
                    memory,
                    "--work-dir",
                    str(work_dir),
                ],
                env,
                log_dir,
            )
        )
        _wait_for_worker(web_url, {"master": master, "worker": worker}, log_dir)
        yield StandaloneCluster(master_url=master_url, master_web_url=web_url, work_dir=work_dir, log_dir=log_dir)
