"""Errors of the emulated service and the `{"error": "<message>"}` answers they become."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException


class ServiceError(Exception):
    """An answer other than success; `message` is safe to show (it never holds a secret)."""

    status = 500

    def __init__(self, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = dict(headers or {})


class BadRequest(ServiceError):
    status = 400


class Unauthorized(ServiceError):
    status = 401


class NotFound(ServiceError):
    status = 404


def error_response(
    status: int, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=dict(headers or {}))


async def _service_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return error_response(exc.status, exc.message, exc.headers)


async def _http_error(_: Request, exc: Exception) -> Response:
    # Starlette's own 404 (no route) and 405 (wrong method), in the service's error shape.
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, str(exc.detail), exc.headers)


async def _validation_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    problems = [
        f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()
    ]
    return error_response(400, "; ".join(problems) or "invalid request")


async def _unexpected(_: Request, exc: Exception) -> Response:
    return error_response(500, "internal error")


def install_error_handlers(app: FastAPI) -> None:
    """Every error the app answers is `{"error": ...}`, as the service's are."""
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
