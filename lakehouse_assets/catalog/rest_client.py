"""PyIceberg's REST catalog client with a timeout on every request.

PyIceberg's ``RestCatalog`` sends its requests through a ``requests`` session with no timeout
(apache/iceberg-python#2772, open), so a catalog server that accepts a connection and never
answers holds the process that asked (a committer pass reading its table, a sensor, a check) for
ever. Going around the library here, through its own extension point (``py-catalog-impl``): the
session it creates gets an adapter that gives every request the timeouts of Iceberg's Java client,
read from the same catalog properties (``rest.client.connection-timeout-ms``,
``rest.client.socket-timeout-ms``), so one setting bounds both clients.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.catalog.rest import RestCatalog
from requests import PreparedRequest, Response, Session
from requests.adapters import HTTPAdapter

from lakehouse_assets.catalog.catalogs import (
    REST_CONNECTION_TIMEOUT,
    REST_CONNECTION_TIMEOUT_MS,
    REST_SOCKET_TIMEOUT,
    REST_SOCKET_TIMEOUT_MS,
)


class _TimeoutAdapter(HTTPAdapter):
    """Sends every request with ``timeout`` (connect, read seconds) unless it has one of its own."""

    def __init__(self, timeout: tuple[float, float]) -> None:
        super().__init__()
        self.timeout = timeout

    def send(self, request: PreparedRequest, **kwargs: Any) -> Response:  # type: ignore[override]
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self.timeout
        return super().send(request, **kwargs)


class TimedRestCatalog(RestCatalog):
    """``RestCatalog`` whose sessions (the configuration's fetch and every later request) time out."""

    def _create_session(self) -> Session:
        session = super()._create_session()
        timeout = (
            int(self.properties.get(REST_CONNECTION_TIMEOUT, REST_CONNECTION_TIMEOUT_MS)) / 1000,
            int(self.properties.get(REST_SOCKET_TIMEOUT, REST_SOCKET_TIMEOUT_MS)) / 1000,
        )
        adapter = _TimeoutAdapter(timeout)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session
