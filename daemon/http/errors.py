"""What the daemon's two HTTP listeners share: JSON error bodies for routing errors and
for a store that does not answer; in their OpenAPI documents, the error body's schema and
the listeners' own refusals."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import SkipJsonSchema
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from daemon.store import StoreUnavailable


async def json_http_error(request: Request, exc: Exception) -> Response:
    """`{"error": ...}` instead of Starlette's plain-text 404 and 405 (docs/api.md)."""
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": exc.detail}, exc.status_code, headers=exc.headers)


async def store_unavailable(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": f"the store is unavailable: {exc}"}, 503)


EXCEPTION_HANDLERS: dict[Any, Any] = {
    HTTPException: json_http_error,
    StoreUnavailable: store_unavailable,
}


class Error(BaseModel):
    """Every error body (docs/api.md), as the OpenAPI documents publish it."""

    # Some errors say more: the reload's `problems`, `/readyz`'s `reasons`, a rotation.
    model_config = ConfigDict(extra="allow")

    error: str
    field: str | SkipJsonSchema[None] = None  # absent, never null, when no field applies


def error(description: str, model: type[BaseModel] = Error) -> dict[str, Any]:
    """One error status in a route's `responses=`."""
    return {"model": model, "description": description}


STORE_UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: error("The store does not answer (the call can be made again).")
}


# The listeners refuse these themselves (daemon/http/listener.py), before any route sees the
# request, so every operation of either document may answer them.
LISTENER_REFUSALS = {
    "408": "the headers or the body were too slow to arrive",
    "431": "the headers are over the limit",
    "503": "too many connections are busy",
}


def with_listener_refusals(document: dict[str, Any]) -> dict[str, Any]:
    """`document` with LISTENER_REFUSALS among each operation's answers; where a route
    answers the same status itself, its body may now be either."""
    refused = {"$ref": "#/components/schemas/Error"}
    for operations in document["paths"].values():
        for operation in operations.values():
            responses = operation["responses"]
            for status, why in LISTENER_REFUSALS.items():
                if status not in responses:
                    content = {"application/json": {"schema": refused}}
                    responses[status] = {"description": f"Refused: {why}.", "content": content}
                    continue
                responses[status]["description"] += f" Or refused: {why}."
                media = responses[status]["content"]["application/json"]
                if media["schema"] != refused:
                    media["schema"] = {"anyOf": [media["schema"], refused]}
    return document
