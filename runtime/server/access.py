"""Who may call the server: `--api-key` (the key as `Authorization: Bearer KEY` or `x-api-key: KEY`,
as the OpenAI and Anthropic clients send it) on every /v1 and /admin endpoint, with a 401 in the
protocol's error shape otherwise (Anthropic's for /v1/messages, OpenAI's elsewhere); /health,
/metrics and /load stay open, as vLLM leaves them. Optional CORS (`--allowed-origins`) through
Starlette's middleware, outside the key check so that browsers' preflight requests pass."""

from __future__ import annotations

import hmac
import json
from collections.abc import Sequence

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from dsgraph.runtime.server.request_log import Message, Receive, RequestLog, Scope, Send

__all__ = ["ApiKey", "install_access"]

_PROTECTED = ("/v1/", "/admin/")


def _presented(scope: Scope) -> str | None:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key")


def _unauthorized(path: str) -> bytes:
    message = "invalid or missing API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')"
    if path.startswith("/v1/messages"):
        body = {"type": "error", "error": {"type": "authentication_error", "message": message}}
    else:
        body = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        }
    return json.dumps(body).encode()


class ApiKey:
    """ASGI middleware: /v1 requests need the key."""

    def __init__(self, app, key: str) -> None:  # type: ignore[no-untyped-def]
        self.app, self.key = app, key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(_PROTECTED) or self._ok(scope):
            await self.app(scope, receive, send)
            return
        body = _unauthorized(path)
        headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
        start: Message = {"type": "http.response.start", "status": 401, "headers": headers}
        await send(start)
        await send({"type": "http.response.body", "body": body})

    def _ok(self, scope: Scope) -> bool:
        given = _presented(scope)
        return given is not None and hmac.compare_digest(given.encode(), self.key)


def install_access(app: FastAPI, api_key: str | None, allowed_origins: Sequence[str]) -> None:
    """Key check, then CORS around it, then the request log around everything (so 401s are logged)."""
    if api_key:
        app.add_middleware(ApiKey, key=api_key)
    if allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(allowed_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["x-request-id"],
        )
    app.add_middleware(RequestLog)
