"""The emulator in-process, its outbound requests going to an in-process `Sink`; or served
on a loopback socket by uvicorn (`served`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from daemon.emulator import Emulator, EmulatorConfig, create_app
from daemon.http.serving import serve
from tests.emulator.support import BEARER, FakeClock, Sink
from tests.support import emulator_config


@pytest.fixture
def config() -> EmulatorConfig:
    return emulator_config(delivery_retry_delay=0.001, max_delay_seconds=0.01)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
async def app(config: EmulatorConfig, clock: FakeClock, sink: Sink) -> AsyncIterator[FastAPI]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=sink)) as outbound:
        app = create_app(config, outbound, clock=clock)
        async with app.router.lifespan_context(app):
            yield app


@pytest.fixture
def emulator(app: FastAPI) -> Emulator:
    emulator: Emulator = app.state.emulator
    return emulator


@pytest.fixture
async def anonymous(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client without credentials (the control API needs none)."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://emulator.test") as client:
        yield client


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client holding the initial bearer token."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://emulator.test", headers=BEARER
    ) as client:
        yield client


@pytest.fixture
async def served(config: EmulatorConfig) -> AsyncIterator[httpx.AsyncClient]:
    """A client holding the initial bearer token, to the emulator served on a real socket."""
    async with (
        serve(create_app(config)) as url,
        httpx.AsyncClient(base_url=url, headers=BEARER) as client,
    ):
        yield client
