"""The daemon assembled, the one place the stages are wired (ARCHITECTURE.md): settings
in, the public and admin ASGI apps out."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import structlog
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from daemon.account import RotationTiming, Rotator
from daemon.account.assembly import account, check_rotation, initial_credentials, vault_for
from daemon.account.rate import SharedRate
from daemon.admin.routes import admin_app
from daemon.admin.shadow import shadow_routes
from daemon.endpoints.api import removal_routes
from daemon.endpoints.remover import Remover
from daemon.http.errors import EXCEPTION_HANDLERS
from daemon.http.listener import Refusal, limited_protocol
from daemon.http.public_api import document as public_openapi
from daemon.http.public_api import openapi_route
from daemon.ingest.protocol import callback_protocol
from daemon.ingest.receiver import CallbackReceiver
from daemon.ingest.signature import Verifier
from daemon.metrics import Listener, Metrics
from daemon.notify.notifier import Notifier
from daemon.pipeline import Pipeline, Tuning
from daemon.rules.live import LiveRules
from daemon.rules.shadow import ShadowRules
from daemon.runtime.descriptors import DescriptorWatch
from daemon.runtime.leadership import Leadership
from daemon.runtime.replicas import Heartbeat, LeaseFence, replica_id
from daemon.runtime.retention import Retention
from daemon.runtime.supervisor import Supervisor
from daemon.settings import ListenerLimits, Settings
from daemon.store import Store, StoreUnavailable, open_store
from daemon.sweeps import Sweeper, SweepRunner, SweepTiming, sweep_routes
from daemon.upstream import BreakerPolicy, RetryPolicy, ServiceClient, service_http

ASGIApp = Callable[..., Any]
log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Daemon:
    """A running daemon's parts: what the listeners serve, and what tests look into."""

    store: Store
    metrics: Metrics
    rules: LiveRules
    shadow: ShadowRules | None  # RECOVERYD_SHADOW_RULES, when set
    pipeline: Pipeline
    rotator: Rotator
    public: ASGIApp
    admin: ASGIApp
    # The listeners' HTTP protocols, with the connection limits (daemon/http/listener.py).
    public_http: type[asyncio.Protocol]
    admin_http: type[asyncio.Protocol]


@contextlib.asynccontextmanager
async def running(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    wall_clock: Callable[[], float] = time.time,
    store_options: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
    tuning: Tuning | None = None,
    rotation: RotationTiming | None = None,
    breaker: BreakerPolicy | None = None,
    http_timeout: float = 10.0,
    sweeps: SweepTiming | None = None,
) -> AsyncIterator[Daemon]:
    """Load the rules, open the store and build both apps; on exit, pending commits land,
    then it closes. FileError or Unreadable when the rules cannot be used, SettingsError
    when the credentials cannot.

    `store_options` go to the store's `open` (timeouts and limits), `retry` and `breaker`
    to the service client, `tuning` to the pipeline, `rotation` to the token rotation,
    `sweeps` to the sweeps, `http_timeout` bounds each call to the service: tests make
    them short.
    """
    metrics = Metrics(registry if registry is not None else CollectorRegistry())
    rules = LiveRules(settings.RULES, metrics, wall_clock=wall_clock)
    shadow = None if settings.SHADOW_RULES is None else ShadowRules(settings.SHADOW_RULES, metrics)
    if shadow is not None:
        rules.also_reload(shadow.reload)
    if settings.CREDENTIALS_KEY is None:  # else read once the store is open
        check_rotation(settings, (await initial_credentials(settings, None))[0])
    observe = metrics.commit_size.observe
    supervisor = Supervisor(metrics)
    async with (
        open_store(settings.STORE, observe_commit=observe, **(store_options or {})) as store,
        service_http(http_timeout) as http,
    ):
        vault = vault_for(settings, store)
        credentials, saved = await initial_credentials(settings, vault)
        check_rotation(settings, credentials)
        client, rotator = account(
            settings, http, store, metrics, vault, credentials, saved, retry, rotation,
            wall_clock, supervisor, breaker,
        )  # fmt: skip
        replica = replica_id()
        fence = LeaseFence(settings.REPLICA_LEASE, shared=store.shared)
        pipeline = Pipeline(
            store, client, rules, metrics, dry_run=settings.DRY_RUN, fetch=settings.FETCH,
            replica=replica, fence=fence, tuning=tuning, supervisor=supervisor, shadow=shadow,
            wall_clock=wall_clock,
        )  # fmt: skip
        client.on_breaker_change = _breaker_watch(metrics, pipeline.breaker_changed)
        rotator.on_unlocked = pipeline.service_back
        shared_rate = SharedRate(store, client.limiter, replica, supervisor)
        heartbeat = Heartbeat(
            store, replica, metrics, lease=settings.REPLICA_LEASE, limiter=client.limiter,
            fence=fence, on_gone=pipeline.replicas_gone, supervisor=supervisor,
            wall_clock=wall_clock,
        )  # fmt: skip
        retention = Retention(
            store, metrics, keep=settings.RETENTION, dlq_retention=rotator.dlq_retention,
            budget_window=lambda: rules.current.longest_budget_window(), wall_clock=wall_clock,
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
        descriptors = DescriptorWatch()
        readiness = Readiness(store, descriptors=descriptors)
        sweeper = Sweeper(
            rules, SweepRunner(client, store, metrics, wall_clock=wall_clock), store, metrics,
            supervisor, dry_run=settings.DRY_RUN, timing=sweeps, wall_clock=wall_clock,
        )  # fmt: skip
        admin_token = settings.ADMIN_TOKEN
        admin = admin_app(
            token=None if admin_token is None else admin_token.get_secret_value(),
            store=store, metrics=metrics, rules=rules, rotator=rotator, client=client,
            on_redriven=pipeline.wake, wall_clock=wall_clock, not_ready=readiness.reasons,
            status_parts=[sweeper.status, heartbeat.status, supervisor.status],
            sweeper=sweeper, header_prefix=settings.HEADER_PREFIX, shadow=shadow,
        )  # fmt: skip
        admin.include_router(sweep_routes(sweeper))
        admin.include_router(shadow_routes(shadow, store))
        admin.include_router(removal_routes(store, client, metrics, wall_clock))
        remover = _remover(settings, store, client, metrics, tuning, wall_clock)
        singletons = Leadership(
            store.singleton_lock(replica),
            [
                rotator.running,
                sweeper.running,
                lambda: _notifying(store, metrics, tuning, supervisor, wall_clock),
                lambda: supervisor.running("retention", retention.run),
                lambda: supervisor.running("endpoint-remover", remover.run),
            ],
            metrics,
        )
        async with (
            heartbeat.running(),
            shared_rate.running(),
            rotator.following(),
            pipeline.running(),
            singletons.running(),
            supervisor.running("descriptors", descriptors.run),
        ):
            yield Daemon(
                store=store,
                metrics=metrics,
                rules=rules,
                shadow=shadow,
                pipeline=pipeline,
                rotator=rotator,
                public=public_app(receiver, readiness, public_openapi(settings)),
                admin=admin,
                public_http=_limited(
                    "public", settings.listener_limits, metrics, callback_protocol(receiver)
                ),
                admin_http=_limited("admin", settings.listener_limits, metrics),
            )


def _remover(
    settings: Settings,
    store: Store,
    client: ServiceClient,
    metrics: Metrics,
    tuning: Tuning | None,
    wall_clock: Callable[[], float],
) -> Remover:
    """remove-endpoint's removals, carried out with the pipeline's waits."""
    tuning = tuning or Tuning()
    return Remover(
        store, client, metrics, max_per_hour=settings.MAX_REMOVALS_PER_HOUR,
        retry_base=tuning.retry_base, retry_cap=tuning.retry_cap, idle_poll=tuning.idle_poll,
        wall_clock=wall_clock,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def _notifying(
    store: Store,
    metrics: Metrics,
    tuning: Tuning | None,
    supervisor: Supervisor,
    wall_clock: Callable[[], float],
) -> AsyncIterator[Notifier]:
    """The notify action's deliveries, on an HTTP client of their own: the receivers are
    the users' webhooks, not the service (none of its rate limit, retries or breakers)."""
    timing = (tuning or Tuning()).notify
    async with httpx.AsyncClient(timeout=timing.timeout, follow_redirects=False) as http:
        notifier = Notifier(
            store, http, metrics, timing=timing, supervisor=supervisor, wall_clock=wall_clock
        )
        async with notifier.running():
            yield notifier


def _limited(
    listener: Listener,
    limits: ListenerLimits,
    metrics: Metrics,
    route: type[HttpToolsProtocol] = HttpToolsProtocol,
) -> type[asyncio.Protocol]:
    """The listener's HTTP protocol, its refusals counted by reason."""
    refusals = metrics.listener_refusals

    def refused(reason: Refusal) -> None:
        refusals.labels(listener, reason).inc()

    return limited_protocol(limits, listener, refused, route)


def _breaker_watch(
    metrics: Metrics, pipeline: Callable[[str, str], None]
) -> Callable[[str, str], None]:
    """The client's circuit breakers, as a metric and one log line per change, and told
    to the pipeline (the work waiting for the service is due once it is back)."""

    def changed(operation: str, state: str) -> None:
        pipeline(operation, state)
        metrics.circuit_open.labels(operation).set(0 if state == "closed" else 1)
        if state == "open":
            log.warning("the service keeps failing calls; holding them back and probing",
                        operation=operation)  # fmt: skip
        elif state == "closed":
            log.info("the service answers again; calls resume", operation=operation)

    return changed


class Readiness:
    """`/readyz`: ready while a callback sent now is stored: the store answers and is
    healthy, and descriptors are not at their limit.

    Nothing else fails it. A token lockout, an open circuit, a crashed task or a service
    outage stop the work after the store, not the storing: a replica taken out of its
    Service for them would have the service's callbacks refused (and, with one replica,
    retried and then lost) while its store could keep them. Those show in
    `/api/v1/status`, the metrics and the alerts instead (docs/operating.md, Probes)."""

    def __init__(self, store: Store, *, descriptors: DescriptorWatch) -> None:
        self._store = store
        self._descriptors = descriptors

    async def reasons(self) -> list[str]:
        """Why a callback sent now would not be stored; empty when it would."""
        reasons = []
        try:
            await self._store.ping()
        except StoreUnavailable as exc:
            reasons.append(f"store: {exc}")
        return reasons + self._descriptors.problems()


def public_app(
    receiver: CallbackReceiver, readiness: Readiness, openapi: dict[str, Any]
) -> ASGIApp:
    """The listener the service calls. `/callbacks` goes straight to the receiver; the
    probes, `openapi` at /openapi.json and every other path go through Starlette's routing."""

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        reasons = await readiness.reasons()
        if reasons:
            return JSONResponse(
                {"error": "not ready: " + "; ".join(reasons), "reasons": reasons}, 503
            )
        return JSONResponse({"status": "ready"})

    probes = Starlette(
        routes=[Route("/healthz", healthz), Route("/readyz", readyz), openapi_route(openapi)],
        exception_handlers=EXCEPTION_HANDLERS,
    )

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/callbacks":
            await receiver(scope, receive, send)
        else:
            await probes(scope, receive, send)

    return app
