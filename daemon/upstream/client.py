"""The async client for the service's operations (spec section 4), over an injected httpx client.

Every call goes through one path, `_call`: the current credentials, the operation's
circuit breaker, the shared rate limiter, translation of failures into the error
tree, and the retry policy.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx

from daemon.upstream.breaker import BreakerPolicy, Breakers, State
from daemon.upstream.credentials import Credentials, CredentialsHolder
from daemon.upstream.errors import (
    HTTPX_ERRORS,
    CircuitOpen,
    CorruptResponse,
    Fenced,
    InvalidResponse,
    NotFound,
    ServiceError,
    Unauthorized,
    error_from_response,
    from_httpx,
    is_transient,
    surely_not_carried_out,
)
from daemon.upstream.headers import rate_hint
from daemon.upstream.models import (
    AccountRecord,
    BulkAction,
    BulkFilter,
    BulkResult,
    DLQMessage,
    EndpointRef,
    FailedWorkflowRuns,
    Overrides,
    URLGroup,
    usable_in_path,
)
from daemon.upstream.ratelimit import RateLimiter, Slot
from daemon.upstream.retry import RetryPolicy

MAX_BULK = 50  # the service processes at most 50 workflow runs per bulk call
MAX_LISTED = 100  # QStash's listing of failed workflow runs answers at most 100 a page
# A dlqId no message has: reading it tells a good token (404) from a refused one (401).
TOKEN_CHECK_ID = "recoveryd-token-check"
# How long a connection to the service is kept idle for the next call. Shorter than the
# servers' own keep-alive (uvicorn's and Node's 5 s, gunicorn's 2 s): a call sent on a
# connection the server is closing for idling at that moment gets no answer, and a bulk
# call without an answer is an outcome unknown that costs a check of each of its dlqIds.
IDLE_CONNECTION_EXPIRY = 1.5
# The operation names: of calls, metric labels, and circuit breakers.
OPERATIONS = (
    "get_dlq_message",
    "resume",
    "restart",
    "get_url_group",
    "remove_endpoints",
    "add_endpoints",
    "rotate_token",
    "check_token",
    "list_workflow_dlq",
)
# httpcore's trace events for "the request headers are being written now".
_SEND_STARTED = frozenset(
    {"http11.send_request_headers.started", "http2.send_request_headers.started"}
)

Auth = Literal["bearer", "basic"]
T = TypeVar("T")


def service_http(timeout: float) -> httpx.AsyncClient:
    """The HTTP client for calls to the service, each bounded by `timeout` seconds."""
    return httpx.AsyncClient(
        timeout=timeout, limits=httpx.Limits(keepalive_expiry=IDLE_CONNECTION_EXPIRY)
    )


@dataclass(frozen=True)
class CallRecord:
    """One attempt at a service call, for logs and metrics (never carries credentials)."""

    operation: str
    method: str
    path: str
    attempt: int
    status: int | None  # None when no response came back
    error: str | None  # the error's reason, None on success
    seconds: float

    @property
    def outcome(self) -> str:
        """The status code, or the error's reason when no answer came (a metric label)."""
        return str(self.status) if self.status is not None else self.error or "error"

    def to_json(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "method": self.method,
            "path": self.path,
            "attempt": self.attempt,
            "status": self.status,
            "error": self.error,
            "seconds": round(self.seconds, 6),
        }


@dataclass(frozen=True)
class _Request:
    method: str
    url: str
    path: str  # for records: the URL without the base, which may hold credentials
    params: tuple[tuple[str, str], ...]
    json: Any
    headers: dict[str, str]


class ServiceClient:
    """The five operations of the spec, plus QStash's read and add of URL Group endpoints.

    Each operation has a circuit breaker (`breaker_states`, `retry_at`): after repeated
    transient failures its calls fail fast with CircuitOpen, without touching the
    network or the rate limiter, until a single probe call finds the service back.
    `on_breaker_change(operation, state)`, when set, is told of every change of state
    (not of every call); it must not raise.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        base_url: str,
        credentials: CredentialsHolder,
        account_url: str | None = None,
        header_prefix: str = "Service",
        retry: RetryPolicy | None = None,
        limiter: RateLimiter | None = None,
        observe: Callable[[CallRecord], None] | None = None,
        breaker: BreakerPolicy | None = None,
        on_breaker_change: Callable[[str, str], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._http = http
        self._base_url = base_url.rstrip("/")
        self._account_url = (account_url or base_url).rstrip("/")
        self._credentials = credentials
        self.header_prefix = header_prefix
        self._retry = retry or RetryPolicy()
        self.limiter = limiter or RateLimiter(clock=clock, sleep=sleep)
        self._observe = observe
        # Told when the service refuses the token and no rotation explains it.
        self.on_refused: Callable[[], None] | None = None
        self.on_breaker_change = on_breaker_change
        self.breakers = Breakers(
            OPERATIONS, breaker, clock=clock, rand=rand, on_change=self._breaker_changed
        )
        self._sleep = sleep
        self._clock = clock
        self._wall_clock = wall_clock
        self._rand = rand

    # -- the operations --------------------------------------------------------------

    async def get_dlq_message(self, dlq_id: str) -> DLQMessage:
        """Spec 4.1. Raises NotFound once the message has left the DLQ."""
        return await self._call(
            "get_dlq_message",
            "GET",
            f"/v2/dlq/{_segment(dlq_id)}",
            _json(DLQMessage.model_validate, "get_dlq_message"),
        )

    async def rotate_token(self) -> AccountRecord:
        """Spec 4.2: reset the account token; the answer carries the new credentials.

        Not idempotent: it is repeated only when the request never reached the
        service. Any other failure leaves the outcome unknown and is raised. It passes
        the credentials gate: it runs inside `CredentialsHolder.rotating()`, whose caller
        saves and swaps the new credentials. The account's rate limit is adopted here.
        """
        record = await self._call(
            "rotate_token",
            "POST",
            "/service/user/rotatetoken",
            _json(AccountRecord.lenient, "rotate_token"),
            base=self._account_url,
            auth="basic",
            idempotent=False,
            credentials=self._credentials.current,
        )
        self.limiter.learn(record.max_requests_per_second, "account")
        return record

    async def token_works(self, credentials: Credentials | None = None) -> bool:
        """Whether the service accepts the token of `credentials` (default: the current
        ones), passing the credentials gate: a read of a dlqId that does not exist
        answers 404 to a good token and 401 to a refused one. Any other failure is raised
        once the retry policy gives up: the answer is then unknown."""
        try:
            await self._call(
                "check_token",
                "GET",
                f"/v2/dlq/{TOKEN_CHECK_ID}",
                _no_body,
                credentials=credentials or self._credentials.current,
            )
        except NotFound:
            return True
        except Unauthorized:
            return False
        return True

    async def remove_endpoints(self, group: str, endpoints: Sequence[EndpointRef]) -> None:
        """Spec 4.3. Removing the last endpoint deletes the group."""
        await self._call(
            "remove_endpoints",
            "DELETE",
            f"/v2/topics/{_segment(group)}/endpoints",
            _no_body,
            json={"endpoints": _endpoint_list(endpoints)},
        )

    async def get_url_group(self, group: str) -> URLGroup:
        """QStash's get-URL-Group (not in the spec): the group's endpoints."""
        return await self._call(
            "get_url_group",
            "GET",
            f"/v2/topics/{_segment(group)}",
            _json(URLGroup.model_validate, "get_url_group"),
        )

    async def add_endpoints(self, group: str, endpoints: Sequence[EndpointRef]) -> None:
        """QStash's add-endpoints (not in the spec), creating the group if needed."""
        await self._call(
            "add_endpoints",
            "POST",
            f"/v2/topics/{_segment(group)}/endpoints",
            _no_body,
            json={"endpoints": _endpoint_list(endpoints)},
        )

    async def bulk(
        self,
        action: BulkAction,
        *,
        dlq_ids: Sequence[str] = (),
        filter: BulkFilter | None = None,
        overrides: Overrides | None = None,
        cursor: str | None = None,
        count: int | None = None,
        fence: Callable[[], bool] | None = None,
    ) -> BulkResult:
        """Spec 4.4 / 4.5: one bulk resume or restart call.

        With `dlq_ids` the service ignores every other filter, so passing both is
        refused here. Repeated only when it surely never reached the service (a 429, a
        refused connection): after a 5xx, a timeout or a lost answer the service may
        have acted, and the caller checks what it did rather than sending it blind. By
        dlqIds a repeat could not act on a dlqId twice, but it would report fewer runs
        than were made, and a service that refuses a call naming dlqIds no longer in its
        DLQ answers it 400. By filter a repeat would act on the next matching runs,
        beyond `count`, while the first batch's runs went unreported.

        `fence`, when given, is asked right before each attempt goes out (after any wait
        for the rate limiter); False: that attempt is not sent and Fenced is raised.
        """
        if action not in ("resume", "restart"):
            raise ValueError(f"bulk action must be resume or restart, got {action!r}")
        if dlq_ids and filter is not None:
            raise ValueError("dlq_ids and filter exclude each other: the service ignores filter")
        if len(dlq_ids) > MAX_BULK:
            raise ValueError(f"at most {MAX_BULK} dlqIds per call, got {len(dlq_ids)}")
        if count is not None and count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        params: list[tuple[str, str]] = [("dlqIds", dlq_id) for dlq_id in dlq_ids]
        if filter is not None:
            params += filter.query()
        if cursor:
            params.append(("cursor", cursor))
        if count is not None:
            params.append(("count", str(count)))
        headers = overrides.headers(self.header_prefix) if overrides else {}
        return await self._call(
            action,
            "POST",
            f"/v2/workflows/dlq/{action}",
            _json(BulkResult.model_validate, action),
            params=params,
            headers=headers,
            idempotent=False,
            fence=fence,
        )

    async def list_workflow_dlq(
        self,
        filter: BulkFilter,
        *,
        cursor: str | None = None,
        count: int | None = None,
    ) -> FailedWorkflowRuns:
        """QStash's listing of the failed workflow runs in the DLQ (`GET /v2/workflows/dlq`,
        not in the spec): one page of those `filter` selects, as a bulk call with the same
        filter would, at most `count` (at most 100). A read: retried freely."""
        if count is not None and not 1 <= count <= MAX_LISTED:
            raise ValueError(f"count must be between 1 and {MAX_LISTED}, got {count}")
        params = filter.query()
        if cursor:
            params.append(("cursor", cursor))
        if count is not None:
            params.append(("count", str(count)))
        return await self._call(
            "list_workflow_dlq",
            "GET",
            "/v2/workflows/dlq",
            _json(FailedWorkflowRuns.model_validate, "list_workflow_dlq"),
            params=params,
        )

    async def bulk_pages(
        self,
        action: BulkAction,
        *,
        dlq_ids: Sequence[str] = (),
        filter: BulkFilter | None = None,
        overrides: Overrides | None = None,
        limit: int | None = None,
        fence: Callable[[], bool] | None = None,
    ) -> AsyncIterator[BulkResult]:
        """Follow the cursor until the service is done or `limit` runs were processed;
        `fence` is asked before every attempt of every page (`bulk`)."""
        cursor: str | None = None
        processed = 0
        while limit is None or processed < limit:
            count = MAX_BULK if limit is None else min(MAX_BULK, limit - processed)
            page = await self.bulk(
                action,
                dlq_ids=dlq_ids,
                filter=filter,
                overrides=overrides,
                cursor=cursor,
                count=count,
                fence=fence,
            )
            processed += len(page.workflow_runs)
            yield page
            if page.done:
                return
            if page.cursor == cursor:  # a service bug would otherwise loop forever
                raise ServiceError(f"{action}: the service returned the same cursor twice")
            cursor = page.cursor

    # -- circuit breakers ------------------------------------------------------------

    def breaker_states(self) -> dict[str, State]:
        """Each operation's circuit: "closed", "open" or "half_open" (a probe is out)."""
        return self.breakers.states()

    def retry_at(self, operation: str) -> float | None:
        """When calls of `operation` are worth trying again, on the client's monotonic
        clock; None when a call would go now. While a probe is out this is a short poll
        from now: the probe's outcome decides."""
        return self.breakers[operation].retry_at()

    def _breaker_changed(self, operation: str, state: State) -> None:
        if self.on_breaker_change is not None:
            self.on_breaker_change(operation, state)

    # -- the one path every call takes -----------------------------------------------

    async def _call(
        self,
        operation: str,
        method: str,
        path: str,
        read: Callable[[httpx.Response], T],
        *,
        base: str | None = None,
        auth: Auth = "bearer",
        params: list[tuple[str, str]] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
        idempotent: bool = True,
        credentials: Credentials | None = None,
        fence: Callable[[], bool] | None = None,
    ) -> T:
        """One operation, retried by the policy; `read` turns the answer into the result
        (raising InvalidResponse or CorruptResponse), inside the retry. `credentials`
        given: the call uses them and passes the holder's gate (the rotation's own
        calls); otherwise it waits while a rotation or a lockout holds calls back, then
        uses the current ones. CircuitOpen, and Fenced when `fence` says no before an
        attempt, are raised at once, never retried here.

        The error raised is the last attempt's, unless an earlier attempt may have been
        carried out and the last one was merely refused (a 503, then a 429, an open
        circuit or a refused connection): then the earlier one, since the call as a
        whole may have acted. A final answer (a 404 after a 503) is raised as it is."""
        request = _Request(
            method, f"{base or self._base_url}{path}", path, tuple(params or ()), json,
            headers or {},
        )  # fmt: skip
        started = self._clock()
        attempt = 0
        retried_with_new_token = False
        uncertain: ServiceError | None = None  # an attempt that may have been carried out
        while True:
            attempt += 1
            async with self._credentials_for(credentials) as used:
                try:
                    return await self._attempt(
                        operation, request, read, auth, used, attempt,
                        latest=credentials is None, fence=fence,
                    )  # fmt: skip
                except _HeldBack:
                    attempt -= 1  # never sent: it waits at the holder's gate again
                    continue
                except ServiceError as exc:
                    error = exc
            if not surely_not_carried_out(error):
                uncertain = error
            if isinstance(error, CircuitOpen | Fenced):
                raise _outcome(error, uncertain) from None
            refused = isinstance(error, Unauthorized) and auth == "bearer" and credentials is None
            if refused and not retried_with_new_token and await self._rotated_since(used):
                # The token was rotated while this call was in flight: one more try.
                retried_with_new_token = True
                continue
            if refused and self.on_refused is not None:
                self.on_refused()
            delay = self._retry.next_delay(
                error,
                attempt=attempt,
                elapsed=self._clock() - started,
                rand=self._rand,
                idempotent=idempotent,
            )
            if delay is None:
                raise _outcome(error, uncertain) from None
            # After a 429 the limiter also holds everyone else, as the answer told it.
            await self._sleep(delay)

    async def _attempt(
        self,
        operation: str,
        request: _Request,
        read: Callable[[httpx.Response], T],
        auth: Auth,
        credentials: Credentials,
        attempt: int,
        *,
        latest: bool,
        fence: Callable[[], bool] | None = None,
    ) -> T:
        """One try, past the operation's breaker and the limiter; its outcome is told to
        both. Raises the try's ServiceError. `latest`: the holder's credentials as they
        are once the limiter lets the call go, not `credentials`, taken before the wait:
        another replica may have rotated the token meanwhile (account/rotation.py).
        `fence` is asked last, once the call would go: the limiter's wait may be long."""
        breaker = self.breakers[operation]
        if breaker.retry_at() is not None:  # held back: not even a place in the limiter
            raise breaker.refusal()
        slot = await self.limiter.acquire()
        # Asked before the breaker, so that a call not sent takes no probe's place (an
        # abandoned probe would show the circuit open again).
        if fence is not None and not fence():
            self.limiter.unanswered(slot, sent=False)
            raise Fenced("not sent: the caller's fence holds it back", operation=operation)
        if latest and self._credentials.holding_back:
            # A lockout or a rotation began while this call waited for its place: sent
            # now it would carry a token the service refuses (or is about to).
            self.limiter.unanswered(slot, sent=False)
            raise _HeldBack
        # Asked again: the breaker may have opened, or given the probe to another
        # caller, while this one waited for its place.
        ticket = breaker.admit()
        if ticket is None:
            self.limiter.unanswered(slot, sent=False)
            raise breaker.refusal()
        authorization = _authorization(auth, self._credentials.current if latest else credentials)
        try:
            result = await self._exchange(operation, request, read, authorization, slot, attempt)
        except ServiceError as exc:
            breaker.record(ticket, exc)
            raise
        except BaseException:  # cancelled: the outcome is unknown
            breaker.abandon(ticket)
            raise
        breaker.record(ticket, None)
        return result

    async def _exchange(
        self,
        operation: str,
        request: _Request,
        read: Callable[[httpx.Response], T],
        authorization: str,
        slot: Slot,
        attempt: int,
    ) -> T:
        """Send the request and read the answer, telling the limiter when the request
        went out and what the answer said about the rate limit."""
        started = self._clock()
        try:
            response = await self._http.request(
                request.method,
                request.url,
                params=request.params,
                json=request.json,
                headers={**request.headers, "Authorization": authorization},
                extensions={"trace": _send_tracer(self.limiter, slot)},
            )
        except HTTPX_ERRORS as exc:
            error = from_httpx(exc, operation=operation)
            self.limiter.unanswered(slot, sent=not surely_not_carried_out(error))
            self._record(operation, request, attempt, None, error, self._clock() - started)
            raise error from None
        except BaseException:  # cancelled: the request may have gone out
            self.limiter.unanswered(slot, sent=True)
            raise
        now = self._wall_clock()
        self.limiter.answered(
            slot, status=response.status_code, hint=rate_hint(response.headers, now)
        )
        try:
            failed = error_from_response(response, operation=operation, now=now)
            if failed is not None:
                raise failed
            result = read(response)
        except ServiceError as exc:
            self._record(operation, request, attempt, response, exc, self._clock() - started)
            raise
        self._record(operation, request, attempt, response, None, self._clock() - started)
        return result

    def _credentials_for(
        self, credentials: Credentials | None
    ) -> contextlib.AbstractAsyncContextManager[Credentials]:
        if credentials is not None:
            return contextlib.nullcontext(credentials)
        return self._credentials.using()

    async def _rotated_since(self, used: Credentials) -> bool:
        """Whether newer credentials than `used` are (or, once a rotation under way
        settles, will be) in the holder."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._retry.max_server_wait):
                await self._credentials.settled()
                if self._credentials.refresh is not None:
                    await self._credentials.refresh()
        return self._credentials.current.token != used.token

    def _record(
        self,
        operation: str,
        request: _Request,
        attempt: int,
        response: httpx.Response | None,
        error: ServiceError | None,
        seconds: float,
    ) -> None:
        if self._observe is None:
            return
        self._observe(
            CallRecord(
                operation=operation,
                method=request.method,
                path=request.path,
                attempt=attempt,
                status=response.status_code if response is not None else None,
                error=error.reason if error else None,
                seconds=seconds,
            )
        )


class _HeldBack(Exception):
    """An attempt the holder's gate closed on while it waited for the limiter: not sent,
    it waits at the gate again (ServiceClient._call)."""


def _outcome(last: ServiceError, uncertain: ServiceError | None) -> ServiceError:
    """The error that tells what the call as a whole may have done."""
    refused = is_transient(last) and surely_not_carried_out(last)
    return uncertain if uncertain is not None and refused else last


def _authorization(auth: Auth, credentials: Credentials) -> str:
    if auth == "bearer":
        return f"Bearer {credentials.token}"
    if credentials.username is None or credentials.password is None:
        raise ValueError("the token reset needs the account username and password")
    pair = f"{credentials.username}:{credentials.password}".encode()
    return f"Basic {base64.b64encode(pair).decode()}"


def _segment(value: str) -> str:
    """A path segment, quoted so an id can never change the path."""
    if not usable_in_path(value):
        raise ValueError(f"not a usable id or name in a URL path: {value!r}")
    return quote(value, safe="")


def _json(parse: Callable[[Any], T], operation: str) -> Callable[[httpx.Response], T]:
    """A reader of the answer's JSON as a model. Bytes that are not text at all were
    broken on the way (CorruptResponse, retried); text that is not the spec's JSON is
    InvalidResponse (not retried: a wrong service or version)."""

    def read(response: httpx.Response) -> T:
        try:
            return parse(response.json())
        except UnicodeDecodeError:
            raise CorruptResponse(
                "answer is not text (UnicodeDecodeError)", operation=operation
            ) from None
        except (ValueError, RecursionError) as exc:  # not JSON, or pydantic's ValidationError
            raise InvalidResponse(
                f"answer is not what the spec says ({type(exc).__name__})", operation=operation
            ) from None

    return read


def _no_body(response: httpx.Response) -> None:
    """The reader of an answer whose body does not matter."""


def _send_tracer(
    limiter: RateLimiter, slot: Slot
) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """httpx's trace extension for one request: tells the limiter when it really goes
    out (after waiting for a connection, a connect or a TLS handshake)."""

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event in _SEND_STARTED:
            limiter.sent(slot)

    return trace


def _endpoint_list(endpoints: Sequence[EndpointRef]) -> list[dict[str, str]]:
    if not endpoints:
        raise ValueError("at least one endpoint is needed")
    return [endpoint.wire() for endpoint in endpoints]
