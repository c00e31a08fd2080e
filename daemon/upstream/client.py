"""The async client for the service's operations (spec section 4), over an injected httpx client.

Every call goes through one path, `_call`: the shared rate limiter, the current
credentials, translation of failures into the error tree, and the retry policy.
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

from daemon.upstream.credentials import Credentials, CredentialsHolder
from daemon.upstream.errors import (
    InvalidResponse,
    NotFound,
    RateLimited,
    ServiceError,
    Unauthorized,
    error_from_response,
    from_httpx,
    server_limit,
)
from daemon.upstream.models import (
    AccountRecord,
    BulkAction,
    BulkFilter,
    BulkResult,
    DLQMessage,
    EndpointRef,
    Overrides,
    URLGroup,
    usable_in_path,
)
from daemon.upstream.ratelimit import RateLimiter
from daemon.upstream.retry import RetryPolicy

MAX_BULK = 50  # the service processes at most 50 workflow runs per bulk call
# A dlqId no message has: reading it tells a good token (404) from a refused one (401).
TOKEN_CHECK_ID = "recoveryd-token-check"

Auth = Literal["bearer", "basic"]
T = TypeVar("T")


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


class ServiceClient:
    """The five operations of the spec, plus QStash's read and add of URL Group endpoints."""

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
        self._sleep = sleep
        self._clock = clock
        self._wall_clock = wall_clock
        self._rand = rand

    # -- the operations --------------------------------------------------------------

    async def get_dlq_message(self, dlq_id: str) -> DLQMessage:
        """Spec 4.1. Raises NotFound once the message has left the DLQ."""
        response = await self._call("get_dlq_message", "GET", f"/v2/dlq/{_segment(dlq_id)}")
        return _parse(DLQMessage.model_validate, response, "get_dlq_message")

    async def rotate_token(self) -> AccountRecord:
        """Spec 4.2: reset the account token; the answer carries the new credentials.

        Not idempotent: it is repeated only when the request never reached the
        service. Any other failure leaves the outcome unknown and is raised. It passes
        the credentials gate: it runs inside `CredentialsHolder.rotating()`, whose caller
        saves and swaps the new credentials. The account's rate limit is adopted here.
        """
        response = await self._call(
            "rotate_token",
            "POST",
            "/service/user/rotatetoken",
            base=self._account_url,
            auth="basic",
            idempotent=False,
            credentials=self._credentials.current,
        )
        record = _parse(AccountRecord.lenient, response, "rotate_token")
        self.limiter.learn(record.max_requests_per_second)
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
            json={"endpoints": _endpoint_list(endpoints)},
        )

    async def get_url_group(self, group: str) -> URLGroup:
        """QStash's get-URL-Group (not in the spec): the group's endpoints."""
        response = await self._call("get_url_group", "GET", f"/v2/topics/{_segment(group)}")
        return _parse(URLGroup.model_validate, response, "get_url_group")

    async def add_endpoints(self, group: str, endpoints: Sequence[EndpointRef]) -> None:
        """QStash's add-endpoints (not in the spec), creating the group if needed."""
        await self._call(
            "add_endpoints",
            "POST",
            f"/v2/topics/{_segment(group)}/endpoints",
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
    ) -> BulkResult:
        """Spec 4.4 / 4.5: one bulk resume or restart call.

        With `dlq_ids` the service ignores every other filter, so passing both is
        refused here. A call by dlqIds is retried freely: processed entries leave the
        DLQ, so a repeat cannot act on them twice (it may report fewer runs than were
        made, when the first answer was lost). A call by filter is repeated only when
        it surely never reached the service: a repeat would act on the next matching
        runs, beyond `count`, while the first batch's runs went unreported.
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
        response = await self._call(
            action,
            "POST",
            f"/v2/workflows/dlq/{action}",
            params=params,
            headers=headers,
            idempotent=bool(dlq_ids),
        )
        return _parse(BulkResult.model_validate, response, action)

    async def bulk_pages(
        self,
        action: BulkAction,
        *,
        dlq_ids: Sequence[str] = (),
        filter: BulkFilter | None = None,
        overrides: Overrides | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[BulkResult]:
        """Follow the cursor until the service is done or `limit` runs were processed."""
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
            )
            processed += len(page.workflow_runs)
            yield page
            if page.done:
                return
            if page.cursor == cursor:  # a service bug would otherwise loop forever
                raise ServiceError(f"{action}: the service returned the same cursor twice")
            cursor = page.cursor

    # -- the one path every call takes -----------------------------------------------

    async def _call(
        self,
        operation: str,
        method: str,
        path: str,
        *,
        base: str | None = None,
        auth: Auth = "bearer",
        params: list[tuple[str, str]] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
        idempotent: bool = True,
        credentials: Credentials | None = None,
    ) -> httpx.Response:
        """One operation, retried by the policy. `credentials` given: the call uses them
        and passes the holder's gate (the rotation's own calls); otherwise it waits while
        a rotation or a lockout holds calls back, then uses the current ones."""
        url = f"{base or self._base_url}{path}"
        started = self._clock()
        attempt = 0
        retried_with_new_token = False
        while True:
            attempt += 1
            response: httpx.Response | None = None
            error: ServiceError | None
            async with self._credentials_for(credentials) as used:
                await self.limiter.acquire()
                sent = self._clock()
                try:
                    response = await self._http.request(
                        method,
                        url,
                        params=tuple(params or ()),
                        json=json,
                        headers={**(headers or {}), "Authorization": _authorization(auth, used)},
                    )
                except httpx.TransportError as exc:
                    error = from_httpx(exc, operation=operation)
                else:
                    now = self._wall_clock()
                    error = error_from_response(response, operation=operation, now=now)
                    self.limiter.learn(server_limit(response.headers), settled=error is None)
            self._record(operation, method, path, attempt, response, error, self._clock() - sent)
            if error is None:
                assert response is not None
                return response
            if (
                isinstance(error, Unauthorized)
                and auth == "bearer"
                and credentials is None
                and not retried_with_new_token
                and await self._rotated_since(used)
            ):
                # The token was rotated while this call was in flight: one more try.
                retried_with_new_token = True
                continue
            refused = isinstance(error, Unauthorized) and auth == "bearer" and credentials is None
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
                raise error
            if isinstance(error, RateLimited):
                self.limiter.pause(delay)  # the whole account is over its limit
            else:
                await self._sleep(delay)

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
        return self._credentials.current.token != used.token

    def _record(
        self,
        operation: str,
        method: str,
        path: str,
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
                method=method,
                path=path,
                attempt=attempt,
                status=response.status_code if response is not None else None,
                error=error.reason if error else None,
                seconds=seconds,
            )
        )


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


def _parse(parse: Callable[[Any], T], response: httpx.Response, operation: str) -> T:
    """The answer's JSON as a model; InvalidResponse when it is not what the spec says."""
    try:
        return parse(response.json())
    except ValueError as exc:  # invalid JSON, or pydantic's ValidationError
        raise InvalidResponse(
            f"answer is not what the spec says ({type(exc).__name__})", operation=operation
        ) from None


def _endpoint_list(endpoints: Sequence[EndpointRef]) -> list[dict[str, str]]:
    if not endpoints:
        raise ValueError("at least one endpoint is needed")
    return [endpoint.wire() for endpoint in endpoints]
