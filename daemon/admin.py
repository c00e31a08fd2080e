"""The admin listener (PRODUCT.md §2): metrics and rules reload; /api/v1 as its stages land.

Never exposed publicly: it reports on, and will change, the running daemon.
"""

from __future__ import annotations

import contextlib

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from daemon.metrics import Metrics
from daemon.rules import FileError, Unreadable
from daemon.rules.live import LiveRules
from daemon.store import Store, StoreUnavailable
from daemon.web import EXCEPTION_HANDLERS


def admin_app(*, store: Store, metrics: Metrics, rules: LiveRules) -> FastAPI:
    app = FastAPI(
        title="recoveryd admin",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        exception_handlers=EXCEPTION_HANDLERS,
    )

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        # Depth is read at scrape time, so it is right even with several replicas on one
        # database; a store that does not answer leaves the last value (and readiness fails).
        with contextlib.suppress(StoreUnavailable):
            metrics.inbox_depth.set(await store.inbox_depth())
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/-/reload")
    async def reload() -> JSONResponse:
        """Load the rules file again; an invalid one is refused and the running rules stay."""
        try:
            ruleset = await rules.reload()
        except FileError as exc:
            error = f"{len(exc.problems)} problem(s) in the rules file; the running rules stay"
            problems = [str(problem) for problem in exc.problems]
            return JSONResponse({"error": error, "problems": problems}, 400)
        except Unreadable as exc:
            return JSONResponse({"error": f"{exc}; the running rules stay"}, 400)
        return JSONResponse(
            {"status": "reloaded", "sha256": ruleset.digest, "rules": len(ruleset.rules)}
        )

    return app
