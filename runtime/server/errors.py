"""The error a request gets: ApiError holds the OpenAI `{"error": {...}}` object (apis.py maps it to each
protocol's shape)."""

from __future__ import annotations

import json

import deepseek_recipe as dr


class ApiError(Exception):
    """A request the server refuses; `body` is the protocol's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": code or kind}}

    @classmethod
    def internal(cls, message: str, status: int = 500) -> ApiError:
        """A failure on the server's side (OpenAI's "server_error"; Anthropic's "api_error")."""
        return cls(
            status, message, code="internal_error" if status == 500 else "unavailable", kind="server_error"
        )

    @classmethod
    def from_conversion(cls, exc: dr.ConversionError) -> ApiError:
        err = cls(int(exc.status_code), str(exc))
        try:
            err.body = json.loads(exc.body)
        except ValueError:
            pass  # keep our own body when the recipe's is not JSON
        return err


class PublicError(RuntimeError):
    """A failure whose message is written for clients (it names the cause in words, never a repr), so
    /health may show it: the engine being down, a dead rank of an expert-parallel group."""
