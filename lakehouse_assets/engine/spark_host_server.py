"""The Spark host itself (``python -m lakehouse_assets.engine.spark_host_server``): one Spark JVM
serving engine calls from the pipeline's runs over the home's socket, one thread per call. The
calling side, and why the host exists, is ``spark_host``."""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import secrets
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from lakehouse_assets import faults
from lakehouse_assets.engine.spark_host import (
    CODE_CHANGED_EXIT,
    JVM_GONE_EXIT,
    POLL_SECONDS,
    STOP_TIMEOUT_SECONDS,
    RemoteCallError,
    authkey,
    code_stamp,
)
from lakehouse_assets.lakehouse import Lakehouse

CALLER_POLL_SECONDS = 0.5
"""How often a call in progress looks whether its caller is still there."""
JVM_EXIT_WAIT_SECONDS = 2.0
"""How long a call whose JVM connection broke waits to see the JVM exit (its socket closes first)."""


class _Host:
    """The serving side: one Spark JVM, one thread per call; exits when idle, when its JVM is gone
    (so that the next call starts a new host instead of failing on a dead one), and on SIGTERM or
    SIGINT once its calls in flight are answered."""

    def __init__(self, idle_timeout: float) -> None:
        self.idle_timeout = idle_timeout
        self.last_call = time.monotonic()
        self.in_flight = 0
        self.guard = threading.Lock()
        self.stopping = threading.Event()
        self.listener: Listener | None = None

    def serve(self, address: str, key: bytes) -> None:
        self.listener = Listener(address, family="AF_UNIX", authkey=key)
        for signal_number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signal_number, self._stop)
        threading.Thread(target=self._exit_when_idle, args=(address,), daemon=True).start()
        threading.Thread(target=self._exit_when_jvm_gone, daemon=True).start()
        print(f"Spark host {os.getpid()} listening on {address}", flush=True)
        while not self.stopping.is_set():
            try:
                connection = self.listener.accept()
            except (OSError, EOFError, AuthenticationError) as refused:  # a wrong key, a client gone, or stopping
                if not self.stopping.is_set():
                    print(f"refused a connection: {refused}", flush=True)
                continue
            # In flight from here until its answer is sent: a stopping host exits once none is.
            with self.guard:
                self.in_flight += 1
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()
        self._finish_calls_and_exit(address)

    def _stop(self, signal_number: int, _frame: Any) -> None:
        """Take no new calls: closing the listener removes its socket, so a run starts a new host."""
        print(f"{signal.Signals(signal_number).name}: taking no new calls", flush=True)
        self.stopping.set()
        if self.listener is not None:
            self.listener.close()

    def _finish_calls_and_exit(self, address: str) -> None:
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        if self.in_flight:
            # Abandoned calls end as a process killed at that point would; their runs repeat them.
            print(f"{self.in_flight} calls still running after {STOP_TIMEOUT_SECONDS:g}s; abandoning them", flush=True)
        Path(address).unlink(missing_ok=True)
        print("stopped", flush=True)
        sys.stdout.flush()
        os._exit(0)  # the JVM exits when this process's pipe to it closes

    def _answer(self, connection: Connection) -> None:
        """Answer one accepted connection: a call, or the question of this host's process id (which
        is not a call: it never keeps a host from its idle exit)."""
        try:
            with connection:
                try:
                    request = connection.recv()
                except EOFError:
                    return
                if request is None:
                    with contextlib.suppress(OSError):  # the asking process may have gone already
                        connection.send(os.getpid())
                    return
                function, lake, args, kwargs = request
                try:
                    self._answer_call(connection, function, lake, args, kwargs)
                finally:
                    with self.guard:
                        self.last_call = time.monotonic()
        finally:
            with self.guard:
                self.in_flight -= 1

    @staticmethod
    def _answer_call(connection: Connection, function: Callable[..., Any], lake: Lakehouse, args, kwargs) -> None:
        call = _Call(function.__name__, connection)
        try:
            result = _run(function, lake, args, kwargs, call.job_group)
            faults.crash_point(faults.HOST_BEFORE_ANSWER, function.__name__)
            answer = ("ok", result)
        except Exception as error:  # noqa: BLE001 - every failure travels back to the calling run
            if _jvm_exited(JVM_EXIT_WAIT_SECONDS if _broke_jvm_connection(error) else 0.0):
                _exit_for_lost_jvm()  # no answer: the caller repeats the call on a new host
            answer = ("error", _travelling(error))
        finally:
            call.done.set()
        with contextlib.suppress(OSError):  # a caller that left gets no answer
            connection.send(answer)

    def _exit_when_idle(self, address: str) -> None:
        while True:
            time.sleep(1.0)
            with self.guard:
                idle = self.in_flight == 0 and time.monotonic() - self.last_call > self.idle_timeout
            if idle:
                print(f"idle for {self.idle_timeout:g}s; exiting", flush=True)
                if self.listener is not None:
                    self.listener.close()
                Path(address).unlink(missing_ok=True)
                os._exit(0)

    def _exit_when_jvm_gone(self) -> None:
        while not _jvm_exited(0.0):
            time.sleep(0.5)
        _exit_for_lost_jvm()


def _jvm_exited(wait_seconds: float) -> bool:
    """Whether this process's Spark JVM has exited, waiting up to ``wait_seconds`` for it to."""
    from pyspark import SparkContext

    process = getattr(SparkContext._gateway, "proc", None)
    deadline = time.monotonic() + wait_seconds
    while process is not None:
        if process.poll() is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
    return False


def _broke_jvm_connection(error: Exception) -> bool:
    from py4j.protocol import Py4JNetworkError

    return isinstance(error, (Py4JNetworkError, ConnectionError))


def _exit_for_lost_jvm() -> None:
    print("the Spark JVM exited; exiting, so that the next call starts a new host", flush=True)
    os._exit(JVM_GONE_EXIT)


class _Call:
    """One engine call being answered: its Spark jobs run in a job group of their own, which is
    cancelled when the caller leaves before the answer (its run was terminated, or its process
    killed), so a call nobody waits for stops at its current Spark job instead of running on.
    Stopping there is safe: every engine call survives a crash at any point."""

    def __init__(self, name: str, connection: Connection) -> None:
        self.name = name
        self.job_group = f"lakehouse-call-{secrets.token_hex(8)}"
        self.done = threading.Event()
        threading.Thread(target=self._cancel_when_caller_leaves, args=(connection,), daemon=True).start()

    def _cancel_when_caller_leaves(self, connection: Connection) -> None:
        # The caller sends nothing after its request: the connection turns readable when it closes.
        while not self.done.wait(CALLER_POLL_SECONDS):
            try:
                left = connection.poll(0)
            except (OSError, EOFError):
                left = True
            if left:
                from pyspark import SparkContext

                print(f"the caller of {self.name} left; cancelling the call's Spark jobs", flush=True)
                if SparkContext._active_spark_context is not None:
                    SparkContext._active_spark_context.cancelJobGroup(self.job_group)
                return


def _run(function: Callable[..., Any], lake: Lakehouse, args, kwargs, job_group: str) -> Any:
    from lakehouse_assets.engine.spark import lakehouse_session

    started = time.monotonic()
    spark = lakehouse_session(lake)
    # Spark's job group is the calling thread's (PySpark pins each Python thread to a JVM thread).
    spark.sparkContext.setJobGroup(job_group, function.__name__, interruptOnCancel=True)
    result = function(spark, lake, *args, **kwargs)
    print(f"{function.__name__} in {time.monotonic() - started:.2f}s", flush=True)
    return result


def _travelling(error: Exception) -> Exception:
    """The error itself when it pickles (the package's own errors do), else its type, message and
    traceback as a RemoteCallError (a py4j error holds JVM references)."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any pickling failure means: send it as text
        text = "".join(traceback.format_exception(error))
        return RemoteCallError(f"{type(error).__name__} on the Spark host: {error}\n{text}")


def main() -> None:
    """``python -m lakehouse_assets.engine.spark_host_server --address A --idle-timeout S``: serve until idle."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--idle-timeout", type=float, required=True)
    parser.add_argument("--code-stamp", required=True, help="the code the calling process runs")
    arguments = parser.parse_args()
    if arguments.code_stamp != code_stamp():
        # The package changed after the caller loaded it: its calls would not match this code.
        print("the package changed since the calling run started; not serving it", flush=True)
        sys.exit(CODE_CHANGED_EXIT)
    from lakehouse_assets.engine.spark import lakehouse_session

    lake = Lakehouse.from_env()
    # Start the JVM and run one job before answering, so the first call finds it warm.
    lakehouse_session(lake).range(1).count()
    _Host(arguments.idle_timeout).serve(arguments.address, authkey(lake.paths))


if __name__ == "__main__":
    main()
