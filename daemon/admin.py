"""The admin listener (PRODUCT.md §2): metrics now; reload and /api/v1 as their stages land.

Never exposed publicly: it reports on, and will change, the running daemon.
"""

from __future__ import annotations

import contextlib

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from daemon.metrics import Metrics
from daemon.store import Store, StoreUnavailable
from daemon.web import EXCEPTION_HANDLERS


def admin_app(*, store: Store, metrics: Metrics) -> FastAPI:
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

    return app
