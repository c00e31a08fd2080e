"""What every suite shares: the test account's credentials, emulator settings, the
`Service` handle (the emulator as a test sees it) and recoveryd running on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import sqlite3
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
from prometheus_client import CollectorRegistry

from daemon.account import RotationTiming
from daemon.app import Daemon, running
from daemon.emulator import EmulatorConfig
from daemon.emulator.signing import sign
from daemon.http.serving import serve
from daemon.pipeline import Tuning
from daemon.settings import load_settings
from daemon.upstream import BreakerPolicy, CredentialsHolder, RetryPolicy, ServiceClient

TOKEN = "tok_tests_initial_token"
USERNAME = "ops@example.com"
PASSWORD = "pw_tests_initial_password"
# 32 bytes or more, so PyJWT has no reason to warn when the tests verify signatures.
SIGNING_KEY_CURRENT = "sig_current_tests_key_0123456789abcdefgh"
SIGNING_KEY_NEXT = "sig_next_tests_key_0123456789abcdefghijk"

# Fast but real backoff, so retry tests take milliseconds.
FAST_RETRY = RetryPolicy(base_delay=0.01, max_delay=0.05, max_attempts=4, max_elapsed=5.0)
# The pipeline's waits, scaled down the same way.
FAST_TUNING = Tuning(
    retry_base=0.05, idle_poll=0.05, housekeeping=0.5, drain_timeout=2.0, lease=30.0
)

# The circuit breakers' waits, scaled down the same way.
FAST_BREAKER = BreakerPolicy(first_open=0.2, max_open=2.0, probe_poll=0.05)

# The token rotation's waits, scaled down the same way.
FAST_ROTATION = RotationTiming(
    drain=1.0, check_first=0.05, check_max=0.2, save_retry=0.05, lockout_poll=0.1
)


# The TLS context of the tests' own clients. They speak plain HTTP on loopback, so it is
# never used; but httpx makes one for each client it is not given one, loading the CA
# bundle each time (some 50 ms of CPU): hundreds of clients a run, and many more where a
# wait asks with `httpx.get` every 50 ms.
LOOPBACK_TLS = ssl.create_default_context()

T = TypeVar("T")
# How often a wait asks again: often enough that a test acts soon after the state shows.
POLL_SECONDS = 0.05


def wait_for(condition: Callable[[], T], seconds: float = 60.0, what: str = "") -> T:
    """Ask `condition` until it gives something true, and return that. A wait, not a
    claim about speed: `seconds` only bounds how long a test hangs when the state never
    comes, and then it fails saying what it waited for."""
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        if time.monotonic() >= deadline:
            raise AssertionError(_still_waiting(seconds, what))
        time.sleep(POLL_SECONDS)
    return found


async def eventually(check: Callable[[], Any], seconds: float = 30.0, what: str = "") -> Any:
    """`wait_for` in a test's event loop: `check` may be sync or async, and the loop runs
    on between two asks. `seconds` bounds the asks too: one that hangs is cut off."""
    limit = asyncio.timeout(seconds)
    try:
        async with limit:
            while True:
                if found := await _asked(check):
                    return found
                await asyncio.sleep(POLL_SECONDS)
    except TimeoutError:
        if not limit.expired():  # the check's own, not the limit's
            raise
        raise AssertionError(_still_waiting(seconds, what)) from None


async def _asked(check: Callable[[], Any]) -> Any:
    found = check()
    return await found if inspect.isawaitable(found) else found


def _still_waiting(seconds: float, what: str) -> str:
    return f"still waiting after {seconds:g} s" + (f" for {what}" if what else "")


@contextlib.contextmanager
def write_locked(database: Path) -> Iterator[None]:
    """The SQLite file's write lock held by another connection (BEGIN IMMEDIATE, as another
    process would) for the block; released, and the connection closed, however it ends."""
    # Closed explicitly: `with sqlite3.connect()` only commits, and Python 3.13 warns (an
    # error in the suite) of a connection left for the garbage collector.
    with contextlib.closing(sqlite3.connect(database, isolation_level=None)) as blocker:
        blocker.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            blocker.execute("ROLLBACK")


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


def faults_taken(control: httpx.Client) -> bool:
    """Whether every fault armed at the emulator has been taken by a call. A call that a
    latency fault holds has its body read when it arrives (daemon.emulator.gate), so
    from then on the service carries it out even if its client is killed."""
    armed: list[Any] = control.get("/_emulator/faults").raise_for_status().json()
    return not armed


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
        kwargs.setdefault("verify", LOOPBACK_TLS)
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

    async def faults_taken(self) -> bool:
        """`faults_taken` (below) for this emulator's async client."""
        armed: list[Any] = (await self.control.get("/_emulator/faults")).raise_for_status().json()
        return not armed


# recoveryd itself, as the tests run it.

SAMPLES = Path(__file__).parent / "testdata" / "samples"
REPO_RULES = Path(__file__).parent.parent / "rules.yaml"
# What the service is told to call; tokens are signed for it (the `sub` claim).
PUBLIC_URL = "https://recoveryd.example.com/callbacks"


# Where a daemon that is not given the emulator looks for the service: a closed port on
# loopback, refused at once (a name that does not resolve can take seconds to fail).
UNREACHABLE_SERVICE = "http://127.0.0.1:9"


def daemon_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """RECOVERYD_* variables for a daemon on a store in `tmp_path`; `settings` change them
    (by name without the prefix; an empty string removes the variable)."""
    env = {
        "RECOVERYD_SERVICE_URL": UNREACHABLE_SERVICE,
        "RECOVERYD_TOKEN": TOKEN,
        "RECOVERYD_SIGNING_KEY_CURRENT": SIGNING_KEY_CURRENT,
        "RECOVERYD_SIGNING_KEY_NEXT": SIGNING_KEY_NEXT,
        "RECOVERYD_PUBLIC_URL": PUBLIC_URL,
        "RECOVERYD_STORE": f"sqlite:///{tmp_path / 'recoveryd.db'}",
        "RECOVERYD_LISTEN": "127.0.0.1:0",
        "RECOVERYD_ADMIN_LISTEN": "127.0.0.1:0",
        "RECOVERYD_RULES": str(REPO_RULES),
    }
    for name, value in settings.items():
        env.pop(f"RECOVERYD_{name}", None)
        if value:
            env[f"RECOVERYD_{name}"] = value
    return env


def callback_json(dlq_id: str, sample: str = "failure-callback.json", **fields: Any) -> bytes:
    """A sample failure callback's bytes with `dlq_id` and `fields` set."""
    body = json.loads((SAMPLES / sample).read_text())
    body.update(dlqId=dlq_id, **fields)
    return json.dumps(body).encode()


def signed(
    body: bytes,
    *,
    key: str = SIGNING_KEY_CURRENT,
    url: str = PUBLIC_URL,
    prefix: str = "Service",
    now: float | None = None,
) -> dict[str, str]:
    """Headers of a callback as the service sends it: JSON, signed by `key` for `url`."""
    token = sign(body, url=url, key=key, issuer=prefix, now=time.time() if now is None else now)
    return {"Content-Type": "application/json", f"{prefix}-Signature": token}


@dataclass
class Recoveryd:
    """A running daemon as the tests see it: both listeners on loopback sockets."""

    daemon: Daemon
    public: httpx.AsyncClient
    admin: httpx.AsyncClient
    registry: CollectorRegistry

    async def post(self, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        """POST `body` to /callbacks, signed as the service would unless `headers` are given."""
        return await self.public.post(
            "/callbacks", content=body, headers=signed(body) if headers is None else headers
        )

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@contextlib.asynccontextmanager
async def together(*managers: contextlib.AbstractAsyncContextManager[T]) -> AsyncIterator[list[T]]:
    """The `managers` entered in turn and left at once: a uvicorn server takes two of its
    0.1 s ticks to stop, so the daemon's two listeners stopped one after the other would
    add 0.2 s to each of the hundreds of tests that start one."""
    entered: list[contextlib.AbstractAsyncContextManager[T]] = []
    try:
        values = []
        for manager in managers:
            values.append(await manager.__aenter__())
            entered.append(manager)
        yield values
    finally:
        # Each left as `async with` would leave it on a clean exit; the first error raised.
        results = await asyncio.gather(
            *(manager.__aexit__(None, None, None) for manager in reversed(entered)),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result


@contextlib.asynccontextmanager
async def running_recoveryd(
    tmp_path: Path,
    *,
    store_options: dict[str, Any] | None = None,
    tuning: Tuning = FAST_TUNING,
    retry: RetryPolicy = FAST_RETRY,
    http_timeout: float = 10.0,
    rotation: RotationTiming = FAST_ROTATION,
    breaker: BreakerPolicy = FAST_BREAKER,
    **settings: str,
) -> AsyncIterator[Recoveryd]:
    """recoveryd on loopback sockets in this event loop, configured by `daemon_env`, with
    the fast retries and pipeline waits of the tests unless told otherwise."""
    registry = CollectorRegistry()
    config = load_settings(daemon_env(tmp_path, **settings))
    async with (
        running(
            config,
            registry=registry,
            store_options=store_options,
            retry=retry,
            tuning=tuning,
            rotation=rotation,
            breaker=breaker,
            http_timeout=http_timeout,
        ) as daemon,
        together(
            serve(daemon.public, http=daemon.public_http),
            serve(daemon.admin, http=daemon.admin_http),
        ) as (public_url, admin_url),
        httpx.AsyncClient(base_url=public_url, timeout=10, verify=LOOPBACK_TLS) as public,
        httpx.AsyncClient(base_url=admin_url, timeout=10, verify=LOOPBACK_TLS) as admin,
    ):
        yield Recoveryd(daemon, public, admin, registry)
