"""What the daemon's two HTTP listeners share: JSON error bodies for routing errors."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


async def json_http_error(request: Request, exc: Exception) -> Response:
    """`{"error": ...}` instead of Starlette's plain-text 404 and 405 (PRODUCT.md §2)."""
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": exc.detail}, exc.status_code, headers=exc.headers)


EXCEPTION_HANDLERS: dict[Any, Any] = {HTTPException: json_http_error}
