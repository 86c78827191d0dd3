"""A request the server refuses: the status, the reason counted in the metrics, and the message."""

from __future__ import annotations


class Refused(Exception):
    """The request is refused with ``status``; ``message`` says what is wrong (it is the body's
    ``error``), ``reason`` is a short label for the metrics, ``headers`` go with the response."""

    def __init__(self, status: int, reason: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.headers = headers or {}
