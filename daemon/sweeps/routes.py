"""`GET /api/v1/sweeps` on the admin listener: each sweep, its schedule, its last runs."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from daemon.sweeps.scheduler import Sweeper

DEFAULT_RUNS = 5
MAX_RUNS = 100  # the store keeps this many runs of a sweep


def sweep_routes(sweeper: Sweeper) -> APIRouter:
    router = APIRouter()

    @router.get("/api/v1/sweeps")
    async def list_sweeps(request: Request) -> JSONResponse:
        """Each sweep in force with its schedule, next run time and latest runs (`?runs=N`,
        default 5): each run's filter, result, pages and the runs it recovered."""
        text = request.query_params.get("runs", str(DEFAULT_RUNS))
        if not text.isdigit() or not 1 <= int(text) <= MAX_RUNS:
            error = f"runs must be a whole number from 1 to {MAX_RUNS}; got {text!r}"
            return JSONResponse({"error": error, "field": "runs"}, 400)
        return JSONResponse({"sweeps": await sweeper.describe(int(text))})

    return router
