"""The server's OpenAPI description (``GET /openapi.json``), for clients and request fuzzers."""

from __future__ import annotations

from typing import Any

from lakehouse_assets.config.spec import HttpServerSpec

_ERROR = {
    "description": "refused; nothing of the request was landed",
    "content": {
        "application/json": {
            "schema": {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}
        }
    },
}


def openapi_document(streams: list[str], limits: HttpServerSpec) -> dict[str, Any]:
    """OpenAPI 3.0 for the served ``streams`` and the configured body limits."""
    acknowledgement = {
        "type": "object",
        "properties": {
            "stream": {"type": "string"},
            "events": {"type": "integer", "description": "events landed by this request"},
            "landing_file": {"type": "string", "description": "the landing file holding them"},
        },
        "required": ["stream", "events", "landing_file"],
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "lakehouse_assets HTTP source",
            "version": "1",
            "description": "POST events to a stream; the answer comes once they are durable in the landing zone.",
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/streams/{stream}/events": {
                "post": {
                    "summary": "Land events, all or nothing",
                    "parameters": [
                        {
                            "name": "stream",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string", "enum": streams},
                        },
                        {
                            "name": "Idempotency-Key",
                            "in": "header",
                            "required": False,
                            "description": "a retry with the same key answers the first response and lands nothing",
                            "schema": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,255}$"},
                        },
                        {
                            "name": "Content-Encoding",
                            "in": "header",
                            "required": False,
                            "schema": {"type": "string", "enum": ["identity", "gzip"]},
                        },
                    ],
                    "requestBody": {
                        "required": True,
                        "description": f"at most {limits.max_request_bytes} bytes as sent and "
                        f"{limits.max_events_bytes} decompressed",
                        "content": {
                            "application/x-ndjson": {
                                "schema": {"type": "string", "description": "one JSON object per line"}
                            },
                            "application/json": {
                                "schema": {
                                    "oneOf": [{"type": "array", "items": {"type": "object"}}, {"type": "object"}]
                                }
                            },
                        },
                    },
                    "responses": {
                        "200": {
                            "description": "landed (or, with Idempotent-Replayed: true, landed by an earlier request)",
                            "content": {"application/json": {"schema": acknowledgement}},
                        },
                        **{
                            status: _ERROR for status in ("400", "401", "403", "404", "408", "413", "415", "422", "503")
                        },
                    },
                }
            },
            "/healthz": {"get": {"summary": "liveness", "security": [], "responses": {"200": {"description": "ok"}}}},
            "/metrics": {
                "get": {"summary": "Prometheus metrics", "security": [], "responses": {"200": {"description": "text"}}}
            },
        },
    }
