"""A fault-injecting proxy on loopback in front of the S3-compatible store: the store's own faults.

Every ``throttle_every``-th request is answered ``503 Slow Down`` (S3's throttling answer) without
reaching the store, and every ``stall_every``-th one is held ``stall_seconds`` before it is passed
on (a slow response). Everything else passes through byte for byte, so the clients' signatures
(which cover the ``Host`` they sent) still hold at the store.

It reads the requests (HTTP/1.1; a body by ``Content-Length`` or chunked) and passes the store's
answers back as they come: a client sends one request at a time on a connection, so an answer of
the proxy's own is only ever written between two of the store's. After one it closes the
connection (``Connection: close``): a client that sent ``Expect: 100-continue`` may not send the
body it held back, and the proxy does not wait to find out.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from typing import BinaryIO

THROTTLED_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
)
THROTTLED = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nConnection: close\r\n"
    b"Content-Length: " + str(len(THROTTLED_BODY)).encode() + b"\r\n\r\n" + THROTTLED_BODY
)


class FaultyStoreProxy:
    """The proxy's listener and what it did: ``requests`` seen, ``throttled`` and ``stalled``."""

    def __init__(self, target_port: int, throttle_every: int, stall_every: int, stall_seconds: float) -> None:
        self.target_port = target_port
        self.throttle_every = throttle_every
        self.stall_every = stall_every
        self.stall_seconds = stall_seconds
        self.requests = self.throttled = self.stalled = 0
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:
            client.close()
            return
        writing = threading.Lock()
        threading.Thread(target=self._answers, args=(upstream, client, writing), daemon=True).start()
        with client, upstream, contextlib.suppress(OSError), client.makefile("rb") as requests:
            while head := _read_head(requests):
                with self._lock:
                    number = next(self._numbers)
                    self.requests += 1
                    throttle = number % self.throttle_every == 0
                    stall = not throttle and number % self.stall_every == 0
                    self.throttled += throttle
                    self.stalled += stall
                if throttle:
                    with writing:
                        client.sendall(THROTTLED)
                    return
                if stall:
                    time.sleep(self.stall_seconds)
                upstream.sendall(head)
                for piece in _body(requests, head):
                    upstream.sendall(piece)

    @staticmethod
    def _answers(upstream: socket.socket, client: socket.socket, writing: threading.Lock) -> None:
        with contextlib.suppress(OSError):  # either side closing ends the pipe
            while chunk := upstream.recv(65536):
                with writing:
                    client.sendall(chunk)
            client.shutdown(socket.SHUT_WR)


def _read_head(stream: BinaryIO) -> bytes:
    """A request's line and headers up to the blank line, or b"" when the client closed."""
    lines = []
    while line := stream.readline():
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)
    return b""


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def _body(stream: BinaryIO, head: bytes) -> Iterator[bytes]:
    """The request's body as it arrives, framing included."""
    if (_header(head, b"transfer-encoding") or b"").lower() == b"chunked":
        while True:
            size_line = stream.readline()
            yield size_line
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (trailer := stream.readline()) not in (b"\r\n", b"\n", b""):
                    yield trailer
                yield b"\r\n"
                return
            yield stream.read(size + 2)
    remaining = int(_header(head, b"content-length") or b"0")
    while remaining > 0:
        piece = stream.read(min(remaining, 65536))
        if not piece:
            return
        remaining -= len(piece)
        yield piece
