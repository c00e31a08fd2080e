"""What every suite shares: the test account's credentials, emulator settings, and the
`Service` handle (the emulator as a test sees it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import httpx

from daemon.emulator import EmulatorConfig
from daemon.upstream import CredentialsHolder, RetryPolicy, ServiceClient

TOKEN = "tok_tests_initial_token"
USERNAME = "ops@example.com"
PASSWORD = "pw_tests_initial_password"
# 32 bytes or more, so PyJWT has no reason to warn when the tests verify signatures.
SIGNING_KEY_CURRENT = "sig_current_tests_key_0123456789abcdefgh"
SIGNING_KEY_NEXT = "sig_next_tests_key_0123456789abcdefghijk"

# Fast but real backoff, so retry tests take milliseconds.
FAST_RETRY = RetryPolicy(base_delay=0.01, max_delay=0.05, max_attempts=4, max_elapsed=5.0)


def emulator_config(**settings: Any) -> EmulatorConfig:
    """The test account's emulator, with `settings` changed."""
    base = EmulatorConfig(
        token=TOKEN,
        username=USERNAME,
        password=PASSWORD,
        signing_key_current=SIGNING_KEY_CURRENT,
        signing_key_next=SIGNING_KEY_NEXT,
    )
    return dataclasses.replace(base, **settings)


def workflows(n: int, **fields: Any) -> list[dict[str, Any]]:
    """`n` workflow DLQ entries to seed, runs wfr_0, wfr_1...; `fields` set on each."""
    return [
        {
            "url": "https://app.example.com/wf",
            "workflowRunId": f"wfr_{i}",
            "callerIP": "203.0.113.7",
            **fields,
        }
        for i in range(n)
    ]


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
