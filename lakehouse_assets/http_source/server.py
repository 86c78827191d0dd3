"""``lakehouse serve``: one uvicorn server per storage root, holding a lock so no second server
journals the same streams. SIGTERM and SIGINT stop it cleanly: it stops accepting connections,
answers the requests in flight (their events land, or they are refused), then exits."""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path

import uvicorn

from lakehouse_assets.errors import ConfigError, LakehouseError
from lakehouse_assets.http_source.app import HttpSource, build_app
from lakehouse_assets.lakehouse import Lakehouse

GRACEFUL_SHUTDOWN_SECONDS = 30
MAX_CONNECTIONS = 2000


def serve(lake: Lakehouse, host: str | None, port: int | None) -> None:
    """Serve the streams that have ``source.landing.http`` until SIGTERM or SIGINT."""
    config, paths = lake.config, lake.paths
    source = HttpSource(lake)
    if not source.streams:
        raise ConfigError("no stream accepts events over HTTP; give one source: {landing: {http: {tokens: [...]}}}")
    with _only_server(paths.http_server_lock):
        settings = uvicorn.Config(
            build_app(source),
            host=host or config.http.host,
            port=port if port is not None else config.http.port,
            access_log=False,
            limit_concurrency=MAX_CONNECTIONS,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
            log_level="info",
        )
        # uvicorn shuts down on SIGTERM/SIGINT, then raises the signal again under the handler it
        # found; with these, that ends `serve` normally (exit 0) instead of by the signal.
        for stop_signal in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop_signal, lambda *_: None)
        uvicorn.Server(settings).run()


class _only_server:
    """An exclusive lock on ``path`` for the server's lifetime; LakehouseError when another holds it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(self.descriptor, 32).decode(errors="replace").strip() or "?"
            os.close(self.descriptor)
            raise LakehouseError(
                f"another lakehouse serve (pid {holder}) serves this storage root ({self.path.parent}); "
                "one server per storage root"
            ) from None
        os.ftruncate(self.descriptor, 0)
        os.write(self.descriptor, str(os.getpid()).encode())

    def __exit__(self, *exc: object) -> None:
        os.close(self.descriptor)
