"""The HTTP application: ``POST /v1/streams/{stream}/events``, ``/healthz``, ``/metrics`` and
``/openapi.json``, on Starlette (the ASGI toolkit Dagster's web server already brings)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from lakehouse_assets.batches.headroom import uncommitted_landing_bytes
from lakehouse_assets.batches.landing import landing_dir
from lakehouse_assets.config.env_references import resolve_env_references
from lakehouse_assets.config.spec import HttpServerSpec, StreamSpec
from lakehouse_assets.http_source.group_commit import GroupCommit
from lakehouse_assets.http_source.idempotency import Acknowledgement, IdempotencyJournal
from lakehouse_assets.http_source.metrics import UNKNOWN_STREAM, HttpMetrics
from lakehouse_assets.http_source.openapi import openapi_document
from lakehouse_assets.http_source.refusals import Refused
from lakehouse_assets.http_source.request_body import decoded, event_lines, read_body
from lakehouse_assets.lakehouse import Lakehouse
from lakehouse_assets.storage_space import storage_failure

LOG = logging.getLogger("lakehouse.http")
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
BACKLOG_POLL_SECONDS = 1.0
RETRY_AFTER_SECONDS = "5"
JOURNAL_FILE = "idempotency.ndjson"


@dataclass
class ServedStream:
    """A stream that accepts events over HTTP: its tokens, its group commit and its keys."""

    spec: StreamSpec
    tokens: tuple[bytes, ...]
    landing: GroupCommit
    journal: IdempotencyJournal
    in_flight: dict[str, asyncio.Future[Acknowledgement | None]] = field(default_factory=dict)
    uncommitted_bytes: int = 0


class HttpSource:
    """The state the handlers share: the served streams, the limits and the metrics."""

    def __init__(self, lake: Lakehouse) -> None:
        config, paths = lake.config, lake.paths
        self.limits: HttpServerSpec = config.http
        self.lake = lake
        self.paths = paths
        self.storage_refusal: str | None = None
        """Why producers are refused to keep room for the drain (``batches.headroom``), or None."""
        self.metrics = HttpMetrics()
        self.streams: dict[str, ServedStream] = {}
        for stream in config.streams:
            http = stream.source.landing.http if stream.source.landing else None
            if http is None:
                continue
            tokens = tuple(
                resolve_env_references(token, f"stream {stream.name!r}: source.landing.http.tokens").encode()
                for token in http.tokens
            )
            directory = landing_dir(paths, stream)
            journal = IdempotencyJournal(
                paths.http(stream.name) / JOURNAL_FILE, directory, self.limits.idempotency_window
            )
            self.streams[stream.name] = ServedStream(stream, tokens, GroupCommit(directory, journal), journal)

    def start(self) -> None:
        """Load every stream's journal (dropping what a killed server left half-landed)."""
        now = time.time()
        for served in self.streams.values():
            served.journal.load(now)

    async def watch_backlogs(self) -> None:
        """Measure each stream's uncommitted landing bytes (for backpressure) and expire old keys."""
        while True:
            for name, served in self.streams.items():
                try:
                    served.uncommitted_bytes = await asyncio.to_thread(
                        uncommitted_landing_bytes, self.paths, served.spec
                    )
                except Exception as error:  # noqa: BLE001 - keeps the last figure; the next poll tries again
                    LOG.warning("stream %r: could not measure its backlog: %s", name, error)
                self.metrics.pending.labels(name).set(served.uncommitted_bytes + served.landing.queued_bytes)
                served.journal.expire(time.time())
            try:
                room = await asyncio.to_thread(self.lake.storage_room)
                self.storage_refusal = room.producer_refusal()
            except OSError as error:  # keeps the last verdict; the next poll measures again
                LOG.warning("could not measure the storage root's free space: %s", error)
            await asyncio.sleep(BACKLOG_POLL_SECONDS)

    def authorized(self, stream_name: str, authorization: str | None) -> ServedStream:
        """The stream, when ``authorization`` carries one of its tokens: 401 for no token or one of
        no stream, 404 for a stream not served, 403 for another stream's token."""
        scheme, _, credentials = (authorization or "").partition(" ")
        token = credentials.strip().encode("latin-1", "replace")
        if scheme.lower() != "bearer" or not token:
            raise Refused(401, "unauthorized", "send Authorization: Bearer <token>", {"WWW-Authenticate": "Bearer"})
        allowed = {name for name, served in self.streams.items() if _one_of(token, served.tokens)}
        if not allowed:
            raise Refused(401, "unauthorized", "the bearer token is not valid", {"WWW-Authenticate": "Bearer"})
        served = self.streams.get(stream_name)
        if served is None:
            raise Refused(404, "unknown_stream", f"no stream named {stream_name!r} accepts events over HTTP")
        if stream_name not in allowed:
            raise Refused(403, "forbidden", f"the bearer token does not allow posting to stream {stream_name!r}")
        return served

    async def post_events(self, request: Request) -> Response:
        """Land one request's events; answer once they are durable, or refuse it and land nothing."""
        arrived = time.monotonic()
        stream_name = request.path_params["stream"]
        label = stream_name if stream_name in self.streams else UNKNOWN_STREAM
        body_bytes = 0
        try:
            served = self.authorized(stream_name, request.headers.get("authorization"))
            key = _idempotency_key(request.headers.get("idempotency-key"))
            body = await read_body(request, self.limits)
            body_bytes = len(body)
            # Decompressing, hashing and parsing a large body take a while: on a thread, so the event
            # loop goes on answering other requests and acknowledging finished group commits.
            events, digest = await asyncio.to_thread(
                _decoded_and_digest, body, request.headers.get("content-encoding"), self.limits.max_events_bytes, key
            )
            acknowledgement, replayed = await self._landed_once(served, key, digest, events, request)
        except Refused as refusal:
            self.metrics.requests.labels(label, str(refusal.status), refusal.reason).inc()
            self.metrics.bytes.labels(label, refusal.reason).inc(body_bytes)
            return JSONResponse({"error": refusal.message}, refusal.status, refusal.headers)
        outcome = "replayed" if replayed else "accepted"
        self.metrics.requests.labels(label, "200", outcome).inc()
        self.metrics.bytes.labels(label, outcome).inc(body_bytes)
        if not replayed:
            self.metrics.events.labels(label).inc(acknowledgement.events)
            self.metrics.latency.labels(label).observe(time.monotonic() - arrived)
        return JSONResponse(
            {"stream": stream_name, "events": acknowledgement.events, "landing_file": acknowledgement.landing_file},
            headers={"Idempotent-Replayed": "true"} if replayed else None,
        )

    async def _landed_once(
        self, served: ServedStream, key: str | None, digest: str, events: bytes, request: Request
    ) -> tuple[Acknowledgement, bool]:
        """The request's acknowledgement and whether it is a replay: a key landed before, or being
        landed by a concurrent request, answers with that request's acknowledgement."""
        if key is None:
            return await self._landed(served, None, digest, events, request), False
        earlier = await self._earlier(served, key)
        if earlier is not None:
            if earlier.body_digest != digest:
                raise Refused(
                    422, "idempotency_conflict", "this Idempotency-Key was used for a request with another body"
                )
            return earlier, True
        # Claimed before the first await, so a concurrent request with the key waits for this one.
        claim: asyncio.Future[Acknowledgement | None] = asyncio.get_running_loop().create_future()
        served.in_flight[key] = claim
        acknowledgement = None
        try:
            acknowledgement = await self._landed(served, key, digest, events, request)
            return acknowledgement, False
        finally:
            claim.set_result(acknowledgement)
            del served.in_flight[key]

    async def _earlier(self, served: ServedStream, key: str) -> Acknowledgement | None:
        """The acknowledgement of ``key``'s landed request, waiting for one in flight; None when
        there is none (or the one in flight was refused: this request is then tried on its own)."""
        while True:
            earlier = served.journal.get(key)
            in_flight = served.in_flight.get(key)
            if earlier is not None or in_flight is None:
                return earlier
            earlier = await asyncio.shield(in_flight)
            if earlier is not None:
                return earlier

    async def _landed(
        self, served: ServedStream, key: str | None, digest: str, events: bytes, request: Request
    ) -> Acknowledgement:
        """Parse the events, refuse them under backpressure, or land them and acknowledge."""
        lines = await asyncio.to_thread(event_lines, events, request.headers.get("content-type"))
        if not lines:
            return Acknowledgement(0, "", time.time(), digest)
        if self.storage_refusal:
            raise Refused(503, "storage", self.storage_refusal, {"Retry-After": RETRY_AFTER_SECONDS})
        if served.uncommitted_bytes + served.landing.queued_bytes > self.limits.max_pending_bytes:
            raise Refused(
                503,
                "backpressure",
                f"stream {served.spec.name!r} has {served.uncommitted_bytes} landed bytes not committed yet "
                f"(max_pending_bytes {self.limits.max_pending_bytes}); retry later",
                {"Retry-After": RETRY_AFTER_SECONDS},
            )
        try:
            return await served.landing.land(lines, digest, key)
        except OSError as error:
            raise _not_landed(error, served.landing.directory) from None


def _decoded_and_digest(body: bytes, encoding: str | None, limit: int, key: str | None) -> tuple[bytes, str]:
    """The decompressed events and, for a request with a key, their digest (kept to refuse the key
    reused for another body)."""
    events = decoded(body, encoding, limit)
    return events, hashlib.sha256(events).hexdigest() if key is not None else ""


def _not_landed(error: OSError, landing: Path) -> Refused:
    """A 503 for events the landing zone refused; a write on an open file (the events, the
    idempotency journal) names no path, so the landing directory stands for it."""
    full = storage_failure(error, "landing the events", [landing])
    return Refused(
        503,
        "storage",
        str(full) if full else f"the events could not be landed ({error.strerror or error})",
        {"Retry-After": RETRY_AFTER_SECONDS},
    )


def _one_of(token: bytes, tokens: tuple[bytes, ...]) -> bool:
    # Every token is compared, in constant time, so the answer's timing says nothing about them.
    return any([hmac.compare_digest(token, candidate) for candidate in tokens])


def _idempotency_key(header: str | None) -> str | None:
    """The digest of an ``Idempotency-Key`` (so the journal holds no client text); 400 when malformed."""
    if header is None:
        return None
    if not IDEMPOTENCY_KEY.fullmatch(header):
        raise Refused(400, "idempotency_key", "Idempotency-Key must be 1-255 visible ASCII characters")
    return hashlib.sha256(header.encode()).hexdigest()


def build_app(source: HttpSource) -> Starlette:
    """The ASGI application over ``source``; its lifespan loads the journals and watches backlogs."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await asyncio.to_thread(source.start)
        watcher = asyncio.create_task(source.watch_backlogs())
        try:
            yield
        finally:
            watcher.cancel()

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "streams": sorted(source.streams)})

    async def metrics(request: Request) -> Response:
        return Response(source.metrics.exposition(), media_type="text/plain; version=0.0.4")

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document(sorted(source.streams), source.limits))

    async def http_error(request: Request, error: Exception) -> Response:
        # Starlette's own refusals (no such route, a method not allowed) in the same JSON form.
        assert isinstance(error, HTTPException)
        return JSONResponse({"error": f"{error.detail}; see /openapi.json"}, error.status_code, error.headers)

    return Starlette(
        exception_handlers={HTTPException: http_error},
        routes=[
            Route("/v1/streams/{stream}/events", source.post_events, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
