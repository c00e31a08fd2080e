"""The admin routes of endpoint removals: `GET /api/v1/removals` and
`POST /api/v1/removals/{group}/{name}/restore`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from daemon.endpoints.restore import RestoreFailed, restore_told
from daemon.http.errors import STORE_UNAVAILABLE, error
from daemon.metrics import Metrics
from daemon.store import Store
from daemon.store.removals import RestoreRefused
from daemon.upstream import ServiceClient


class Removals(BaseModel):
    """Every removal recorded, each as docs/api.md describes it."""

    removals: list[dict[str, Any]]


class Endpoint(BaseModel):
    name: str | None = None  # one of the two at least, as the removal recorded them
    url: str | None = None


class Restored(BaseModel):
    status: Literal["restored"]
    removal: int
    urlGroup: str
    endpoint: Endpoint


def removal_routes(
    store: Store,
    client: ServiceClient,
    metrics: Metrics,
    wall_clock: Callable[[], float] = time.time,
) -> APIRouter:
    """The routes, for the admin app to include."""
    routes = APIRouter()

    @routes.get("/api/v1/removals", responses={200: {"model": Removals}, **STORE_UNAVAILABLE})
    async def removals(group: str | None = None) -> JSONResponse:
        """Every removal recorded (of one URL Group with `?group=`), with its evidence."""
        return JSONResponse({"removals": await store.removals(group)})

    # `:path`: an endpoint without a name goes by its url, sent %2F-encoded; it arrives
    # decoded, and a plain parameter would stop at its first `/`.
    @routes.post(
        "/api/v1/removals/{group}/{name:path}/restore",
        responses={
            200: {"model": Restored},
            404: error("No removal of this endpoint is recorded."),
            409: error("The endpoint was restored already."),
            502: error("The service did not take it; the removal can be restored again."),
            **STORE_UNAVAILABLE,
        },
    )
    async def restore_endpoint(group: str, name: str) -> JSONResponse:
        """Put a removed endpoint back into its group, from the record of its removal. The
        restore carries on if the caller hangs up."""
        try:
            answer = await restore_told(store, client, metrics, group, name, wall_clock)
        except RestoreRefused as exc:
            return JSONResponse({"error": str(exc)}, 404 if exc.kind == "unknown" else 409)
        except RestoreFailed as exc:
            return JSONResponse({"error": str(exc)}, 502)
        return JSONResponse(answer)

    return routes
