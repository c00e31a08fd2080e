"""The admin listener (docs/api.md#admin-listener): metrics, rules reload, and the /api/v1 records.

Never exposed publicly: it reports on, and changes, the running daemon (it can rotate the
account token and reload the rules). With RECOVERYD_ADMIN_TOKEN set, every path but the
probes' and the scrape's needs that bearer token. Nothing here carries a credential:
records hold dlqIds, rules, states and call outcomes only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Receive, Scope, Send

from daemon import __version__
from daemon.account import CredentialsFileError, RotationRefused, Rotator
from daemon.admin.console import Parts, console_app, security
from daemon.admin.listing import listing_routes
from daemon.admin.redrive import RedriveError, RedriveFieldError, RedriveFilter, redrive_told
from daemon.admin.replay import replay_routes
from daemon.admin.schema import (
    CredentialsReloaded,
    DaemonStatus,
    DlqRecord,
    Redriven,
    Reloaded,
    ReloadRefused,
    Rotated,
    RotationFailed,
)
from daemon.http.errors import (
    EXCEPTION_HANDLERS,
    STORE_UNAVAILABLE,
    Error,
    error,
    with_listener_refusals,
)
from daemon.metrics import Metrics
from daemon.rules import FileError, Unreadable
from daemon.rules.live import LiveRules
from daemon.rules.shadow import ShadowRules
from daemon.store import Store, StoreUnavailable
from daemon.sweeps import Sweeper
from daemon.upstream import ServiceClient

log = structlog.get_logger(__name__)


# Open without the admin token: probes and Prometheus must not need a secret.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

# The redrive reads its body by hand (a bad one is a 400 naming its field, not FastAPI's
# 422), so the body's schema is given here; an empty body is the default filter.
_REDRIVE_BODY = {
    "requestBody": {
        "required": False,
        "content": {"application/json": {"schema": RedriveFilter.model_json_schema()}},
    }
}
# The redrive's answer leads to the record of the first dlqId it lists (an OpenAPI link:
# schemathesis' stateful tests follow it).
_TO_RECORD = {
    "record": {
        "operationId": "dlq_record",
        "parameters": {"dlq_id": "$response.body#/dlqIds/0"},
        "description": "The record of the first dlqId listed.",
    }
}


class RequireToken:
    """ASGI middleware: a call to any path but OPEN_PATHS needs `Authorization: Bearer
    <token>`; 401 otherwise. The comparison takes as long whatever the mismatch.

    The console (/ui/) also takes its signed session cookie instead, lets its login
    page and static files through, and sends a browser without either to its login."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()
        self._session_key = security.session_key(token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path not in OPEN_PATHS and not self._let_in(scope):
            refusal: Response = JSONResponse(
                {"error": "the admin API needs Authorization: Bearer <RECOVERYD_ADMIN_TOKEN>"},
                401,
                headers={"WWW-Authenticate": "Bearer"},
            )
            if security.is_console(path):
                refusal = RedirectResponse("/ui/login", 303)
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _let_in(self, scope: Scope) -> bool:
        headers = Headers(scope=scope)
        if hmac.compare_digest(headers.get("authorization", "").encode(), self._expected):
            return True
        path = scope["path"]
        if not security.is_console(path):
            return False
        if path == "/ui/login" or path.startswith("/ui/static/"):
            return True
        session = cookie_parser(headers.get("cookie", "")).get(security.SESSION_COOKIE)
        return security.valid_session(self._session_key, session, time.time())


async def _always_ready() -> list[str]:
    return []


def _require(app: FastAPI, token: str | None) -> None:
    if token is not None:
        app.add_middleware(RequireToken, token=token)
    app.add_middleware(security.ConsoleHeaders)  # outermost: on the token's redirects too


def _document(app: FastAPI, token: str | None) -> None:
    """FastAPI's document, with what its generator cannot see: the listener's own
    refusals, and the token, which the middleware asks for rather than the routes."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            schemas.setdefault("Error", Error.model_json_schema())
            app.openapi_schema = with_listener_refusals(
                document if token is None else _with_token(document)
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _with_token(document: dict[str, Any]) -> dict[str, Any]:
    schemes = document["components"].setdefault("securitySchemes", {})
    bearer = {"type": "http", "scheme": "bearer", "description": "RECOVERYD_ADMIN_TOKEN"}
    schemes["adminToken"] = bearer
    refused = {
        "description": "No `Authorization: Bearer <RECOVERYD_ADMIN_TOKEN>`, or another token.",
        "headers": {"WWW-Authenticate": {"schema": {"type": "string", "const": "Bearer"}}},
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    for path, operations in document["paths"].items():
        if path not in OPEN_PATHS:
            for operation in operations.values():
                operation["security"] = [{"adminToken": []}]
                operation["responses"]["401"] = refused
    return document


def admin_app(
    *,
    token: str | None = None,
    store: Store,
    metrics: Metrics,
    rules: LiveRules,
    rotator: Rotator,
    client: ServiceClient,
    on_redriven: Callable[[], None] = lambda: None,
    wall_clock: Callable[[], float] = time.time,
    status_parts: Sequence[Callable[[], Awaitable[dict[str, Any]]]] = (),
    not_ready: Callable[[], Awaitable[list[str]]] = _always_ready,
    sweeper: Sweeper | None = None,
    header_prefix: str = "Service",
    shadow: ShadowRules | None = None,
) -> FastAPI:
    """`status_parts` each add their keys to `/api/v1/status` (the sweeps' summary);
    `not_ready` says why `/readyz` fails (empty when it would not); `token`, when
    given, is the bearer token every path but OPEN_PATHS needs. The console at /ui/
    shows `sweeper`'s sweeps and the `shadow` rules, and explains decisions with
    `header_prefix`."""
    app = FastAPI(
        title="recoveryd admin",
        docs_url=None,
        redoc_url=None,
        version=__version__,
        openapi_url="/openapi.json",  # behind the token when one is set, as every other path
        exception_handlers=EXCEPTION_HANDLERS,
    )
    _require(app, token)
    _document(app, token)

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"description": "Prometheus text format (docs/metrics.md)."}},
    )
    async def prometheus_metrics() -> Response:
        await _read_store_gauges(store, metrics, wall_clock())
        metrics.rate_limit.set(client.limiter.pace or 0)
        metrics.set_rate_limit_source(client.limiter.source)
        metrics.ready.set(0 if await not_ready() else 1)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # `:path`: a dlqId may hold a `/` (the service does not forbid it); sent %2F-encoded,
    # it arrives decoded, and a plain parameter would stop at it.
    @app.get(
        "/api/v1/dlq/{dlq_id:path}",
        operation_id="dlq_record",  # named, for the redrive's link to point at
        responses={
            200: {"model": DlqRecord},
            404: error("No record of this dlqId."),
            **STORE_UNAVAILABLE,
        },
    )
    async def dlq_record(dlq_id: str) -> JSONResponse:
        """One dlqId's record: state, rules, calls and their results, timestamps."""
        found = await store.record(dlq_id)
        if found is None:
            return JSONResponse({"error": f"no record of dlqId {dlq_id!r}"}, 404)
        return JSONResponse(found)

    async def status() -> dict[str, Any]:
        ruleset = rules.current
        answer: dict[str, Any] = {
            **await store.status(wall_clock()),
            **await rotator.status(),
            "upstream": {"circuits": client.breaker_states()},
            "rules": {
                "sha256": ruleset.digest,
                "rules": len(ruleset.rules),
                "sweeps": len(ruleset.sweeps),
                "source": ruleset.source,
            },
        }
        return answer | await _parts(status_parts)

    @app.get("/api/v1/status", responses={200: {"model": DaemonStatus}, **STORE_UNAVAILABLE})
    async def daemon_status() -> JSONResponse:
        return JSONResponse(await status())

    @app.post(
        "/api/v1/redrive",
        responses={
            200: {"model": Redriven, "links": _TO_RECORD},
            400: error("The body is not JSON, or not a filter; `field` names what is wrong."),
            **STORE_UNAVAILABLE,
        },
        openapi_extra=_REDRIVE_BODY,
    )
    async def redrive_dlq_ids(request: Request) -> JSONResponse:
        """Put final dlqIds back into the pipeline (`recoveryd redrive --yes`); the filter
        as JSON: {"states": ["failed"], "rule": "...", "since": "24h", "dryRun": false}."""
        return await _redrive(await request.body(), store, metrics, on_redriven, wall_clock())

    @app.post(
        "/-/reload",
        responses={
            200: {"model": Reloaded},
            400: error(
                "The rules file is invalid or unreadable; the running rules stay.", ReloadRefused
            ),
        },
    )
    async def reload() -> JSONResponse:
        """Load the rules file again; an invalid one is refused and the running rules stay."""
        return await reloaded(rules)

    @app.post(
        "/-/rotate-token",
        responses={
            200: {"model": Rotated},
            409: error("The rotation was not started, and why."),
            502: error("The rotation failed; the old token still works.", RotationFailed),
            503: error("The rotation ended in a lockout.", RotationFailed),
        },
    )
    async def rotate_token() -> JSONResponse:
        """Rotate the account token now (`recoveryd rotate-token` asks a running daemon
        here). The rotation carries on if the caller hangs up."""
        return await _rotate(rotator)

    app.include_router(_credentials_routes(rotator))
    app.include_router(listing_routes(store, wall_clock))
    app.include_router(replay_routes(store, wall_clock))
    console = Parts(
        store=store, metrics=metrics, rules=rules, client=client, status=status,
        dlq_retention=rotator.dlq_retention, sweeper=sweeper, on_redriven=on_redriven,
        wall_clock=wall_clock, header_prefix=header_prefix, token=token, shadow=shadow,
    )  # fmt: skip
    app.mount("/ui", console_app(console))

    return app


async def _parts(parts: Sequence[Callable[[], Awaitable[dict[str, Any]]]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        merged |= await part()
    return merged


async def _read_store_gauges(store: Store, metrics: Metrics, now: float) -> None:
    # Read at scrape time, so they are right even with several replicas on one database;
    # a store that does not answer leaves the last values (and readiness fails).
    with contextlib.suppress(StoreUnavailable):
        metrics.inbox_depth.set(await store.inbox_depth())
        status = await store.status(now)
        for state, count in status["states"].items():
            metrics.dlq_ids.labels(state).set(count)
        metrics.oldest_pending.set(status["oldestPendingSeconds"])
        metrics.pending_batches.set(status["pendingBatches"])
        metrics.notifications_pending.set(status["notifications"]["pending"])
        metrics.store_size.set(await store.size_bytes())


async def _redrive(
    body: bytes, store: Store, metrics: Metrics, on_redriven: Callable[[], None], now: float
) -> JSONResponse:
    try:
        selection = RedriveFilter.from_json(json.loads(body) if body.strip() else {})
    except (ValueError, RecursionError):  # nested deeper than json's recursion allows
        return JSONResponse({"error": "the body is not JSON"}, 400)
    except RedriveFieldError as exc:
        return JSONResponse({"error": exc.message, "field": exc.field}, 400)
    except RedriveError as exc:
        return JSONResponse({"error": str(exc)}, 400)
    return JSONResponse(await redrive_told(store, selection, now, metrics, on_redriven))


async def reloaded(rules: LiveRules, via: str | None = None) -> JSONResponse:
    """`POST /-/reload`'s answer: the rules loaded again, or why the running ones stay."""
    try:
        ruleset = await rules.reload(via)
    except (FileError, Unreadable):
        result = rules.last_reload
        assert result is not None  # set by the refusal
        answer: dict[str, Any] = {"error": f"{result.error}; the running rules stay"}
        if result.problems:
            answer["problems"] = list(result.problems)
        return JSONResponse(answer, 400)
    return JSONResponse(
        {"status": "reloaded", "sha256": ruleset.digest, "rules": len(ruleset.rules)}
    )


async def _rotate(rotator: Rotator) -> JSONResponse:
    try:
        rotation = await asyncio.shield(rotator.rotate())
    except RotationRefused as exc:
        return JSONResponse({"error": f"rotation not started: {exc}"}, 409)
    answer = {"rotation": rotation.to_json()}
    if rotation.result == "success":
        return JSONResponse({"status": "rotated", **answer})
    error = f"rotation ended in {rotation.result}: {rotation.reason}"
    return JSONResponse({"error": error, **answer}, 503 if rotation.result == "lockout" else 502)


def _credentials_routes(rotator: Rotator) -> APIRouter:
    router = APIRouter()

    @router.post(
        "/-/reload-credentials",
        responses={
            200: {"model": CredentialsReloaded},
            409: error("A rotation or a token check is under way, or no credentials are kept."),
            503: error("The saved credentials cannot be read."),
        },
    )
    async def reload_credentials() -> JSONResponse:
        """Take up the saved credentials now (`recoveryd set-token` asks, once it has
        saved a token): a lockout ends."""
        return await _reload_credentials(rotator)

    return router


async def _reload_credentials(rotator: Rotator) -> JSONResponse:
    try:
        return JSONResponse(await rotator.take_saved_now())
    except RotationRefused as exc:
        return JSONResponse({"error": f"credentials not taken up: {exc}"}, 409)
    except CredentialsFileError as exc:
        return JSONResponse({"error": f"credentials not taken up: {exc}"}, 503)
