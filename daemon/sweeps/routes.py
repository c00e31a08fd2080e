"""`GET /api/v1/sweeps` on the admin listener: each sweep, its schedule, its last runs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from daemon.http.errors import STORE_UNAVAILABLE, error
from daemon.sweeps.scheduler import Sweeper

DEFAULT_RUNS = 5
MAX_RUNS = 100  # the store keeps this many runs of a sweep
# `?runs=` is read by hand, to answer a bad value with a 400 naming the field (not
# FastAPI's 422), so it is documented here.
_RUNS = {
    "name": "runs",
    "in": "query",
    "required": False,
    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_RUNS, "default": DEFAULT_RUNS},
}


class Sweeps(BaseModel):
    """Each sweep and its latest runs, as docs/api.md describes them."""

    sweeps: list[dict[str, Any]]


def sweep_routes(sweeper: Sweeper) -> APIRouter:
    router = APIRouter()

    @router.get(
        "/api/v1/sweeps",
        responses={
            200: {"model": Sweeps},
            400: error(f"`runs` is not a whole number from 1 to {MAX_RUNS}."),
            **STORE_UNAVAILABLE,
        },
        openapi_extra={"parameters": [_RUNS]},
    )
    async def list_sweeps(request: Request) -> JSONResponse:
        """Each sweep in force with its schedule, next run time and latest runs (`?runs=N`,
        default 5): each run's filter, result, pages and the runs it recovered."""
        text = request.query_params.get("runs", str(DEFAULT_RUNS))
        # ASCII: isdigit() alone takes "²", which int() refuses (a 500, not this 400).
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_RUNS:
            message = f"runs must be a whole number from 1 to {MAX_RUNS}; got {text!r}"
            return JSONResponse({"error": message, "field": "runs"}, 400)
        return JSONResponse({"sweeps": await sweeper.describe(int(text))})

    return router
