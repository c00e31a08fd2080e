"""Fixtures shared by every suite: the emulator, in-process or on a real socket, and a client."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from daemon.emulator import EmulatorConfig, create_app
from daemon.serving import serve_in_thread
from daemon.upstream import Credentials, CredentialsHolder, RetryPolicy, ServiceClient

TOKEN = "tok-test-initial"
USERNAME = "ops@example.com"
PASSWORD = "pw-test-initial"
SIGNING_KEY_CURRENT = "sig-test-current"
SIGNING_KEY_NEXT = "sig-test-next"

# Fast but real backoff, so retry tests take milliseconds.
FAST_RETRY = RetryPolicy(base_delay=0.01, max_delay=0.05, max_attempts=4, max_elapsed=5.0)


@pytest.fixture
def emulator_config() -> EmulatorConfig:
    return EmulatorConfig(
        token=TOKEN,
        username=USERNAME,
        password=PASSWORD,
        signing_key_current=SIGNING_KEY_CURRENT,
        signing_key_next=SIGNING_KEY_NEXT,
        delivery_retry_delay=0.01,
        # Seeded workflow URLs are fictional hosts: record the runs, do not deliver them.
        execute_runs=False,
    )


@dataclass
class Service:
    """The emulator as the tests see it: its URL, a client for it and its control API."""

    base_url: str
    transport: httpx.AsyncBaseTransport | None
    credentials: CredentialsHolder
    client: ServiceClient
    control: httpx.AsyncClient  # /_emulator/* and raw calls
    client_http: httpx.AsyncClient  # the one `client` uses

    def http(self, **kwargs: Any) -> httpx.AsyncClient:
        """Another raw client to the same emulator (e.g. with other credentials)."""
        return httpx.AsyncClient(base_url=self.base_url, transport=self.transport, **kwargs)

    def client_with(self, http: httpx.AsyncClient | None = None, **options: Any) -> ServiceClient:
        """A client for this emulator with other options (limiter, retry, observe...)."""
        options.setdefault("retry", FAST_RETRY)
        return ServiceClient(
            http or self.client_http,
            base_url=self.base_url,
            credentials=self.credentials,
            **options,
        )

    async def seed(self, *messages: dict[str, Any]) -> list[str]:
        response = await self.control.post("/_emulator/dlq", json={"messages": list(messages)})
        response.raise_for_status()
        ids: list[str] = response.json()["dlqIds"]
        return ids

    async def journal(self) -> list[dict[str, Any]]:
        response = await self.control.get("/_emulator/journal")
        response.raise_for_status()
        calls: list[dict[str, Any]] = response.json()
        return calls

    async def fault(self, **fault: Any) -> None:
        (await self.control.post("/_emulator/faults", json=fault)).raise_for_status()


@pytest.fixture(params=["asgi", "socket"])
async def service(
    request: pytest.FixtureRequest, emulator_config: EmulatorConfig
) -> AsyncIterator[Service]:
    """The emulator served in-process through ASGITransport, or by uvicorn on loopback."""
    if request.param == "asgi":
        async with httpx.AsyncClient() as outbound:
            app = create_app(emulator_config, http_client=outbound)
            transport = httpx.ASGITransport(app=app)
            async with _service("http://emulator.test", transport) as service:
                yield service
    else:
        with serve_in_thread(create_app(emulator_config)) as url:
            async with _service(url, None) as service:
                yield service


@contextlib.asynccontextmanager
async def _service(
    base_url: str, transport: httpx.AsyncBaseTransport | None
) -> AsyncIterator[Service]:
    async with (
        httpx.AsyncClient(transport=transport, timeout=5.0) as http,
        httpx.AsyncClient(base_url=base_url, transport=transport, timeout=10.0) as control,
    ):
        credentials = CredentialsHolder(Credentials(TOKEN, USERNAME, PASSWORD))
        client = ServiceClient(http, base_url=base_url, credentials=credentials, retry=FAST_RETRY)
        yield Service(base_url, transport, credentials, client, control, http)
