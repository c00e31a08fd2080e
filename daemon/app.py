"""The daemon assembled: settings in, the public and admin ASGI apps out (STYLE.md §1)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from daemon.admin import admin_app
from daemon.ingest.receiver import CallbackReceiver
from daemon.ingest.signature import Verifier
from daemon.metrics import Metrics
from daemon.pipeline import Pipeline, Tuning
from daemon.pipeline.calls import observer
from daemon.rules.live import LiveRules
from daemon.settings import Settings
from daemon.store import Store, StoreUnavailable, open_store
from daemon.upstream import (
    CallRecord,
    Credentials,
    CredentialsHolder,
    RateLimiter,
    RetryPolicy,
    ServiceClient,
)
from daemon.web import EXCEPTION_HANDLERS

ASGIApp = Callable[..., Any]


@dataclass(frozen=True)
class Daemon:
    """A running daemon's parts: what the listeners serve, and what tests look into."""

    store: Store
    metrics: Metrics
    rules: LiveRules
    pipeline: Pipeline
    public: ASGIApp
    admin: ASGIApp


@contextlib.asynccontextmanager
async def running(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    wall_clock: Callable[[], float] = time.time,
    store_options: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
    tuning: Tuning | None = None,
    http_timeout: float = 10.0,
) -> AsyncIterator[Daemon]:
    """Load the rules, open the store and build both apps; on exit, pending commits land,
    then it closes. FileError or Unreadable when the rules cannot be used.

    `store_options` go to the store's `open` (timeouts and limits), `retry` to the service
    client, `tuning` to the pipeline, `http_timeout` bounds each call to the service:
    tests make them short.
    """
    metrics = Metrics(registry if registry is not None else CollectorRegistry())
    rules = LiveRules(settings.RULES, metrics, wall_clock=wall_clock)
    token = settings.token()
    observe = metrics.commit_size.observe
    async with (
        open_store(settings.STORE, observe_commit=observe, **(store_options or {})) as store,
        httpx.AsyncClient(timeout=http_timeout) as http,
    ):
        client = _service_client(settings, http, token, retry, observer(metrics, wall_clock))
        pipeline = Pipeline(
            store, client, rules, metrics, dry_run=settings.DRY_RUN, tuning=tuning,
            wall_clock=wall_clock,
        )  # fmt: skip
        verifier = None
        if settings.signing_keys:
            verifier = Verifier(settings.signing_keys, settings.HEADER_PREFIX, settings.PUBLIC_URL)
        receiver = CallbackReceiver(
            store=store,
            metrics=metrics,
            verifier=verifier,
            allow_unsigned=settings.ALLOW_UNSIGNED,
            header_prefix=settings.HEADER_PREFIX,
            max_body_bytes=settings.MAX_BODY_BYTES,
            wall_clock=wall_clock,
            on_accepted=pipeline.wake,
        )
        readiness = Readiness(store, token_present=bool(token))
        async with pipeline.running():
            yield Daemon(
                store=store,
                metrics=metrics,
                rules=rules,
                pipeline=pipeline,
                public=public_app(receiver, readiness),
                admin=admin_app(store=store, metrics=metrics, rules=rules, wall_clock=wall_clock),
            )


def _service_client(
    settings: Settings,
    http: httpx.AsyncClient,
    token: str | None,
    retry: RetryPolicy | None,
    observe: Callable[[CallRecord], None],
) -> ServiceClient:
    password = settings.ACCOUNT_PASSWORD.get_secret_value() if settings.ACCOUNT_PASSWORD else None
    credentials = Credentials(token or "", settings.ACCOUNT_USERNAME, password)
    return ServiceClient(
        http,
        base_url=settings.service_url,
        account_url=settings.account_url,
        credentials=CredentialsHolder(credentials),
        header_prefix=settings.HEADER_PREFIX,
        retry=retry,
        observe=observe,
        limiter=RateLimiter(settings.MAX_RPS, pinned=settings.MAX_RPS is not None, probe=True),
    )


class Readiness:
    """`/readyz`: ready when the store answers and a token is present (PRODUCT.md §2)."""

    def __init__(self, store: Store, *, token_present: bool) -> None:
        self._store = store
        self._token_present = token_present

    async def reasons(self) -> list[str]:
        """Why the daemon is not ready; empty when it is."""
        reasons = []
        try:
            await self._store.ping()
        except StoreUnavailable as exc:
            reasons.append(f"store: {exc}")
        if not self._token_present:
            reasons.append("no token: set RECOVERYD_TOKEN or RECOVERYD_TOKEN_FILE")
        return reasons


def public_app(receiver: CallbackReceiver, readiness: Readiness) -> ASGIApp:
    """The listener the service calls. `/callbacks` goes straight to the receiver; the
    probes and every other path go through Starlette's routing."""

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        reasons = await readiness.reasons()
        if reasons:
            return JSONResponse({"error": "not ready: " + "; ".join(reasons)}, 503)
        return JSONResponse({"status": "ready"})

    probes = Starlette(
        routes=[Route("/healthz", healthz), Route("/readyz", readyz)],
        exception_handlers=EXCEPTION_HANDLERS,
    )

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/callbacks":
            await receiver(scope, receive, send)
        else:
            await probes(scope, receive, send)

    return app
