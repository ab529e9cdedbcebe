"""Errors the HTTP API returns, in OpenAI's body: ``{"error": {"message", "type", "param",
"code"}}``, so SDKs raise their own typed exceptions (``BadRequestError``,
``AuthenticationError``, ``InternalServerError``…) with the message intact."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """One HTTP error response."""

    def __init__(self, status: int, message: str, *, type_: str, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message: str, *, param: str | None = None,
                code: str = "invalid_value") -> APIError:
    return APIError(400, message, type_="invalid_request_error", code=code, param=param)


def unsupported(param: str, why: str) -> APIError:
    return APIError(400, f"{param}: {why}", type_="invalid_request_error",
                    code="unsupported_parameter", param=param)


def unauthorized(message: str) -> APIError:
    return APIError(401, message, type_="authentication_error", code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})


def overloaded(retry_after_s: int) -> APIError:
    return APIError(503, "the server's request queue is full; retry later",
                    type_="server_error", code="server_overloaded",
                    headers={"Retry-After": str(retry_after_s)})


def not_found(message: str, param: str | None = None) -> APIError:
    return APIError(404, message, type_="invalid_request_error", code="model_not_found",
                    param=param)


def internal(message: str) -> APIError:
    return APIError(500, message, type_="server_error", code="internal_error")
