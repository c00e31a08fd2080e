"""Fixtures shared by every suite: the emulator (in-process or on a real socket) with a
client, and recoveryd on loopback."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from daemon.emulator import EmulatorConfig, create_app
from daemon.http.serving import serve_in_thread
from daemon.upstream import Credentials, CredentialsHolder, ServiceClient
from tests import postgres, system_tools
from tests.support import (
    FAST_RETRY,
    LOOPBACK_TLS,
    PASSWORD,
    TOKEN,
    USERNAME,
    Recoveryd,
    Service,
    running_recoveryd,
)
from tests.support import emulator_config as emulator_config_with


@pytest.fixture
def emulator_config() -> EmulatorConfig:
    # Seeded workflow URLs are fictional hosts: record the runs, do not deliver them.
    return emulator_config_with(delivery_retry_delay=0.01, execute_runs=False)


@pytest.fixture(params=["asgi", "socket"])
async def service(
    request: pytest.FixtureRequest, emulator_config: EmulatorConfig
) -> AsyncIterator[Service]:
    """The emulator served in-process through ASGITransport, or by uvicorn on loopback."""
    if request.param == "asgi":
        async with httpx.AsyncClient() as outbound:
            app = create_app(emulator_config, http_client=outbound)
            transport = httpx.ASGITransport(app=app)
            try:
                async with _service("http://emulator.test", transport) as service:
                    yield service
            finally:
                # ASGITransport runs no lifespan: end the emulator's background work here.
                await app.state.emulator.aclose()
    else:
        with serve_in_thread(create_app(emulator_config)) as url:
            async with _service(url, None) as service:
                yield service


@contextlib.asynccontextmanager
async def _service(
    base_url: str, transport: httpx.AsyncBaseTransport | None
) -> AsyncIterator[Service]:
    async with (
        httpx.AsyncClient(transport=transport, timeout=5.0, verify=LOOPBACK_TLS) as http,
        httpx.AsyncClient(
            base_url=base_url, transport=transport, timeout=10.0, verify=LOOPBACK_TLS
        ) as control,
    ):
        credentials = CredentialsHolder(Credentials(TOKEN, USERNAME, PASSWORD))
        client = ServiceClient(http, base_url=base_url, credentials=credentials, retry=FAST_RETRY)
        yield Service(base_url, transport, credentials, client, control, http)


@pytest.fixture
async def recoveryd(tmp_path: Path) -> AsyncIterator[Recoveryd]:
    """recoveryd with the test settings (tests.support.daemon_env), on loopback sockets."""
    async with running_recoveryd(tmp_path) as daemon:
        yield daemon


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server for this worker's tests (tests/postgres.py): a superuser's URL.
    Skipped, with the reason, where there is none (failed under CI)."""
    if not os.environ.get(postgres.ENVIRONMENT):
        system_tools.require("postgres", otherwise=f"or set {postgres.ENVIRONMENT}")
    with postgres.cluster() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """An empty database of this test's own on the server."""
    with postgres.fresh_database(postgres_server) as url:
        yield url


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `needs(...)` is skipped, naming the Debian packages, where one of
    its programs is missing (fails under CI): tests/system_tools.py."""
    system_tools.require(
        *(program for marker in item.iter_markers("needs") for program in marker.args)
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `slow` first: the workers hand tests out in this order, so the minutes
    a slow one takes pass while the other worker runs the rest, not after it."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
