"""``lakehouse serve``: one uvicorn server per storage root, holding a lock so no second server
journals the same streams. SIGTERM and SIGINT stop it cleanly: it stops accepting connections,
answers the requests in flight (their events land, or they are refused), then exits."""

from __future__ import annotations

import signal

import uvicorn

from lakehouse_assets.errors import ConfigError, LakehouseError
from lakehouse_assets.http_source.app import HttpSource, build_app
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.locks import lock_if_free

GRACEFUL_SHUTDOWN_SECONDS = 30
MAX_CONNECTIONS = 2000


def serve(lake: Lakehouse, host: str | None, port: int | None) -> None:
    """Serve the streams that have ``source.landing.http`` until SIGTERM or SIGINT."""
    config, paths = lake.config, lake.paths
    source = HttpSource(lake)
    if not source.streams:
        raise ConfigError("no stream accepts events over HTTP; give one source: {landing: {http: {tokens: [...]}}}")
    with lock_if_free(paths.http_server_lock) as only_server:
        if not only_server:
            raise LakehouseError(f"another lakehouse serve holds {paths.http_server_lock}: one server per storage root")
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
