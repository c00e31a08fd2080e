"""`create_app`: the emulator's FastAPI app, its routes, error shape, gate and lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI

from daemon.emulator.config import EmulatorConfig
from daemon.emulator.control_api import control
from daemon.emulator.emulator import Clock, Emulator, Sleep
from daemon.emulator.errors import install_error_handlers
from daemon.emulator.gate import ServiceGate
from daemon.emulator.service_api import account, messages


def create_app(
    config: EmulatorConfig | None = None,
    http_client: httpx.AsyncClient | None = None,
    *,
    clock: Clock = time.time,
    sleep: Sleep = asyncio.sleep,
) -> FastAPI:
    """The emulator as an ASGI app; its state is `app.state.emulator`.

    `http_client` carries the outbound deliveries and callbacks (its owner closes it);
    without one the emulator makes its own, closed at the end of the lifespan. `clock`
    (unix seconds) drives timestamps and rate-limit windows, `sleep` every wait.
    """
    config = config or EmulatorConfig()
    emulator = Emulator(config, http_client=http_client, clock=clock, sleep=sleep)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        emulator.http_client()
        try:
            yield
        finally:
            await emulator.aclose()

    app = FastAPI(
        title="recoveryd service emulator",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.state.emulator = emulator
    install_error_handlers(app)
    app.include_router(messages)
    app.include_router(account)
    app.include_router(control)
    app.add_middleware(ServiceGate, emulator=emulator)
    return app
