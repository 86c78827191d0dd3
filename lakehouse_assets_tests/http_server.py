"""A real ``lakehouse serve`` process on loopback, for the HTTP source's tests."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

STARTUP_SECONDS = 30
# ``httpx.get`` and ``httpx.post`` open a client for each request, and each client builds a TLS
# context from the CA bundle: 0.025 CPU-s a request, some 60 CPU-s over the suite's thousands
# (``docs/benchmarks.md``). The tests speak plain HTTP on loopback; one context serves them all.
_TLS_CONTEXT = ssl.create_default_context()


def request(method: str, url: str, **options: Any) -> httpx.Response:
    """``httpx.request``, on a connection of its own, with the suite's one TLS context."""
    return httpx.request(method, url, verify=_TLS_CONTEXT, **options)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class HttpServer:
    """``lakehouse serve`` with the test's homes and config (and ``extra_env``); ``start`` waits
    until it answers ``/healthz``."""

    def __init__(self, log: Path, extra_env: dict[str, str] | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        self.log = log
        self.extra_env = extra_env or {}
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HttpServer:
        """Start the process and wait until it answers ``/healthz``."""
        self.launch()
        if not self.wait_until_answering():
            assert self.process is not None
            raise AssertionError(f"lakehouse serve exited with {self.process.returncode}:\n{self.log.read_text()}")
        return self

    def wait_until_answering(self) -> bool:
        """True once the process answers ``/healthz``; False when it exits first."""
        assert self.process is not None
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                if request("GET", f"{self.url}/healthz", timeout=1).status_code == 200:
                    return True
            except httpx.TransportError:
                time.sleep(0.05)
        raise AssertionError(f"lakehouse serve did not answer within {STARTUP_SECONDS} s:\n{self.log.read_text()}")

    def launch(self) -> HttpServer:
        """Start the process without waiting for it to answer."""
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "lakehouse_assets.cli.main", "serve", "--port", str(self.port)],
                env={**os.environ, **self.extra_env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def kill(self) -> None:
        """SIGKILL, as a power cut or an OOM kill would end it."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> int:
        """SIGTERM, and its exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    def __enter__(self) -> HttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
