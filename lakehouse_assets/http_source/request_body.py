"""A request's body as event lines: read within limits, decompressed within limits, parsed as
NDJSON or a JSON array; every refusal names what is wrong, and nothing is landed."""

from __future__ import annotations

import asyncio
import json
import zlib

from starlette.requests import ClientDisconnect, Request

from lakehouse_assets.batches.landing import validated_lines
from lakehouse_assets.config.spec import MAX_LANDING_FILE_BYTES, HttpServerSpec
from lakehouse_assets.errors import IngestError
from lakehouse_assets.http_source.refusals import Refused

JSON_TYPE = "application/json"
# Decompressed in steps of this many bytes, so a gzip bomb is cut off at the limit, not after.
_INFLATE_STEP = 1024 * 1024


async def read_body(request: Request, limits: HttpServerSpec) -> bytes:
    """The body as sent; 413 past ``max_request_bytes`` (before reading it when Content-Length
    says so), 408 when the client has not sent it within ``body_timeout``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_request_bytes:
        raise _too_large(limits.max_request_bytes, "as sent")
    chunks: list[bytes] = []
    size = 0

    async def receive_all() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_request_bytes:
                raise _too_large(limits.max_request_bytes, "as sent")
            chunks.append(chunk)

    try:
        await asyncio.wait_for(receive_all(), timeout=limits.body_timeout)
    except asyncio.TimeoutError:
        raise Refused(408, "timeout", f"the body was not received within {limits.body_timeout:g} s") from None
    except ClientDisconnect:
        raise Refused(400, "disconnected", "the client disconnected before sending the whole body") from None
    return b"".join(chunks)


def decoded(body: bytes, content_encoding: str | None, max_events_bytes: int) -> bytes:
    """The body decompressed (``Content-Encoding: gzip``) to at most ``max_events_bytes``."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "identity":
        if len(body) > max_events_bytes:
            raise _too_large(max_events_bytes, "of events")
        return body
    if encoding != "gzip":
        raise Refused(415, "encoding", f"Content-Encoding {encoding!r} is not supported; send gzip or identity")
    inflated: list[bytes] = []
    size = 0
    remaining = body
    try:
        while remaining:  # a gzip body may hold several members, one after another
            member = zlib.decompressobj(wbits=31)
            data = remaining
            while not member.eof:
                # With its input used up, a member may still hold output: asked again with b"".
                part = member.decompress(data, _INFLATE_STEP)
                size += len(part)
                if size > max_events_bytes:
                    raise _too_large(max_events_bytes, "decompressed")
                inflated.append(part)
                data = member.unconsumed_tail
                if not part and not data:  # no input left and no output: the stream is cut short
                    break
            if not member.eof:
                raise Refused(400, "gzip", "the gzip body is truncated")
            remaining = member.unused_data
    except zlib.error as error:
        raise Refused(400, "gzip", f"the body is not valid gzip ({error})") from None
    return b"".join(inflated)


def event_lines(body: bytes, content_type: str | None) -> list[bytes]:
    """The events as newline-terminated JSON lines: a JSON array of objects (or one object) with
    ``Content-Type: application/json``; otherwise NDJSON, line by line, by the rule of ``lakehouse
    ingest`` (any other type, so ``curl --data-binary @events.ndjson`` works as it is)."""
    media_type = (content_type or "").split(";")[0].strip().lower()
    try:
        if media_type == JSON_TYPE:
            return _array_lines(body)
        return validated_lines(body.split(b"\n"), "body")
    except IngestError as error:
        raise Refused(400, "invalid_event", str(error)) from None


def _array_lines(body: bytes) -> list[bytes]:
    try:
        document = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise IngestError(f"body: not UTF-8 (byte {error.start + 1}); nothing was landed") from None
    except json.JSONDecodeError as error:
        raise IngestError(
            f"body: not valid JSON ({error.msg} at line {error.lineno} column {error.colno}); nothing was landed"
        ) from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise IngestError(f"body: not valid JSON ({error}); nothing was landed") from None
    except RecursionError:
        raise IngestError("body: JSON nested too deeply; nothing was landed") from None
    events = document if isinstance(document, list) else [document]
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise IngestError(f"body element {index}: expected a JSON object; nothing was landed")
    try:
        lines = [_event_line(event) for event in events]
    except RecursionError:
        raise IngestError("body: JSON nested too deeply; nothing was landed") from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise IngestError(f"body: {error}; nothing was landed") from None
    if sum(map(len, lines)) > MAX_LANDING_FILE_BYTES:
        raise Refused(413, "too_large", f"the events are larger than {MAX_LANDING_FILE_BYTES} bytes as NDJSON")
    return lines


def _event_line(event: dict) -> bytes:
    """One event as an NDJSON line in UTF-8, or with ASCII escapes when a string holds a lone
    surrogate (which json accepts and UTF-8 cannot encode)."""
    text = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        return json.dumps(event, separators=(",", ":")).encode("ascii") + b"\n"


def _too_large(limit: int, measure: str) -> Refused:
    return Refused(413, "too_large", f"the body is larger than {limit} bytes {measure}")
