"""What the daemon's two HTTP listeners share: JSON error bodies for routing errors and
for a store that does not answer."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from daemon.store import StoreUnavailable


async def json_http_error(request: Request, exc: Exception) -> Response:
    """`{"error": ...}` instead of Starlette's plain-text 404 and 405 (PRODUCT.md §2)."""
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": exc.detail}, exc.status_code, headers=exc.headers)


async def store_unavailable(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": f"the store is unavailable: {exc}"}, 503)


EXCEPTION_HANDLERS: dict[Any, Any] = {
    HTTPException: json_http_error,
    StoreUnavailable: store_unavailable,
}
