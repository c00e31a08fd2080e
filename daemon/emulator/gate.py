"""The door of the service API: journal, outage, faults and the rate limit, before routing."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from daemon.emulator.account import DEFAULT_LIMITS, Account, parse_basic, parse_bearer
from daemon.emulator.emulator import Emulator
from daemon.emulator.errors import error_response
from daemon.emulator.faults import CORRUPT_GZIP, ConnectionDropped, FaultSpec
from daemon.emulator.journal import Call, new_call
from daemon.emulator.outage import ServiceDown, cut_connection
from daemon.emulator.ratelimit import CallLimits, burst_headers

CONTROL_PREFIX = "/_emulator"
ACCOUNT_PATH = "/service/user/rotatetoken"


def is_control(path: str) -> bool:
    return path == CONTROL_PREFIX or path.startswith(CONTROL_PREFIX + "/")


def is_rate_limited(path: str) -> bool:
    """The account's limit counts message operations and the account endpoint."""
    return path.startswith("/v2/") or path == ACCOUNT_PATH


def is_authenticated(scope: Scope, account: Account) -> bool:
    """Whether the call carries the account's credentials. Only such calls count toward
    its rate limit: a call with a bad token cannot be charged to the account, and is
    answered 401, not 429."""
    authorization = Headers(scope=scope).get("authorization", "")
    if scope["path"] == ACCOUNT_PATH:
        basic = parse_basic(authorization)
        return basic is not None and account.credentials_are(*basic)
    token = parse_bearer(authorization)
    return token is not None and account.token_is(token)


def _add_headers(message: Message, headers: dict[str, str]) -> Message:
    """`headers` added to a response start, except those the response already has."""
    present = {name.lower() for name, _ in message.get("headers", [])}
    extra = [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in headers.items()
        if name.lower().encode("latin-1") not in present
    ]
    return {**message, "headers": [*message.get("headers", []), *extra]} if extra else message


class ServiceGate:
    """ASGI middleware in front of every service route (everything but `/_emulator/*`).

    In order: an outage in force answers the call itself (503, drop or hang; see `outage`)
    and nothing below sees it. Otherwise the call is counted in its rate-limit window
    (every authenticated arrival counts), an armed fault is applied, the daily budget
    then the burst limit are enforced (429), and the app answers, which spends one call
    of the daily budget. The `Burst-RateLimit-*` headers go on every answer while a limit
    is set, and the `RateLimit-*` ones while a daily budget is, unless a fault says
    `headers: false`; no `Retry-After` (the service promises none) unless a fault asks
    for it. A 429 other than the daily one carries no `RateLimit-*` header: the SDKs take
    any 429 with `RateLimit-Limit` for the daily limit. The call is journaled when it has
    been answered (or dropped, with status 0).
    """

    def __init__(self, app: ASGIApp, emulator: Emulator) -> None:
        self.app = app
        self.emulator = emulator
        self.service_down = ServiceDown(emulator.outage, emulator.clock, emulator.sleep)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_control(scope["path"]):
            await self.app(scope, receive, send)
            return
        call = new_call(scope, self.emulator.clock())
        try:
            outage = self.emulator.outage.current(self.emulator.clock())
            if outage is not None:
                await self.service_down(outage, scope, receive, send, call)
            else:
                await self._serve(scope, receive, send, call)
        finally:
            self.emulator.journal.record(call)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, call: Call) -> None:
        emulator = self.emulator
        path: str = scope["path"]
        counted = is_rate_limited(path) and is_authenticated(scope, emulator.account)
        now = emulator.clock()
        fault = emulator.faults.take(path)
        limits = CallLimits(
            burst=emulator.limiter.hit(now) if counted else None,
            daily=emulator.daily.check(now) if counted else None,
            quiet=fault is not None and not fault.headers,
        )

        async def receive_journaled() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                call.add_body(message.get("body", b""))
            return message

        async def send_journaled(message: Message) -> None:
            if message["type"] == "http.response.start":
                call.status = message["status"]
                if call.status == 429:
                    emulator.rate_limited += 1
                message = _add_headers(message, limits.headers(call.status))
            await send(message)

        answer: Send = send_journaled
        for_app = await _read_ahead(receive_journaled, fault)
        if fault is not None:
            call.fault = fault.kind
            if fault.kind == "corrupt_gzip" and fault.carriedOut:
                # A proxy mangling the real answer: the service acts, the client cannot read it.
                # (A call over a limit is refused before the service, so not carried out.)
                call.carried_out = limits.refusal is None
                answer = _corrupting(send_journaled)
            elif await self._fault(fault, scope, for_app, send_journaled, call, limits, receive):
                return
        refusal = limits.admit(emulator.daily)
        if refusal is not None:
            await error_response(429, refusal)(scope, for_app, answer)
            return
        await self.app(scope, for_app, answer)

    async def _lose_answer(
        self,
        fault: FaultSpec,
        limits: CallLimits,
        scope: Scope,
        receive: Receive,
        connection: Receive,
        send: Send,
        call: Call,
    ) -> None:
        """The `lost_answer` fault: the service acts on the call (unless a limit refuses
        it), and its answer never reaches the client, which gets the fault's status or a
        connection closed without an answer."""
        refusal = limits.admit(self.emulator.daily)
        call.carried_out = refusal is None
        if refusal is None:
            await self.app(scope, receive, _discard)
        if fault.reset:
            call.status = 0
            await cut_connection(connection)
            return
        message = f"injected fault: the answer was lost ({fault.status})"
        await error_response(fault.status, message)(scope, receive, send)

    async def _fault(
        self,
        fault: FaultSpec,
        scope: Scope,
        receive: Receive,
        send: Send,
        call: Call,
        limits: CallLimits,
        connection: Receive,
    ) -> bool:
        """Apply `fault`; True when it answered the call itself. `connection`: the
        server's own `receive`, through which a connection is cut."""
        if fault.kind == "lost_answer":
            await self._lose_answer(fault, limits, scope, receive, connection, send, call)
            return True
        if fault.kind == "latency":
            await self.emulator.sleep(fault.seconds)
            return False
        if fault.kind == "drop":
            await _drop(send, call)
        response: Response
        if fault.kind == "rate_limit":
            headers = fault.retry_after_header()
            if fault.headers:
                limit = (
                    fault.limit
                    or self.emulator.limiter.limit
                    or DEFAULT_LIMITS["max_requests_per_second"]
                )
                headers = {**burst_headers(limit, 0, int(self.emulator.clock()) + 1), **headers}
            response = error_response(429, "rate limit exceeded", headers)
        elif fault.kind == "malformed":
            response = Response("<html>not the service</html>", media_type="text/html")
        elif fault.kind == "corrupt_gzip":
            call.carried_out = False
            await _send_corrupt(send, 200, [(b"content-type", b"application/json")])
            return True
        else:
            message = f"injected fault: status {fault.status}"
            response = error_response(fault.status, message, fault.retry_after_header())
        await response(scope, receive, send)
        return True


async def _discard(message: Message) -> None:
    """The `send` of an answer that is lost on its way."""


async def _read_ahead(receive: Receive, fault: FaultSpec | None) -> Receive:
    """For a call a latency fault holds: its body read now, and handed to the app when it
    asks. The service has the body before it acts, so a client that goes away while the
    call is held does not undo it."""
    if fault is None or fault.kind != "latency":
        return receive
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            break

    async def replay() -> Message:
        return messages.pop(0) if messages else await receive()

    return replay


# What the original answer said about its body's length and coding no longer holds.
_BODY_HEADERS = frozenset({b"content-length", b"content-encoding", b"transfer-encoding"})


async def _send_corrupt(send: Send, status: int, headers: list[tuple[bytes, bytes]]) -> None:
    """Answer `status` with `headers` and a gzip body that cannot be decoded."""
    kept = [(name, value) for name, value in headers if name.lower() not in _BODY_HEADERS]
    coding = [(b"content-encoding", b"gzip"), (b"content-length", b"%d" % len(CORRUPT_GZIP))]
    await send({"type": "http.response.start", "status": status, "headers": [*kept, *coding]})
    await send({"type": "http.response.body", "body": CORRUPT_GZIP})


def _corrupting(send: Send) -> Send:
    """A `send` that holds back the app's answer and sends it with a corrupt gzip body."""
    start: Message | None = None

    async def corrupt(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            start = message
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            assert start is not None, "an ASGI answer starts before its body"
            await _send_corrupt(send, start["status"], list(start.get("headers", [])))

    return corrupt


async def _drop(send: Send, call: Call) -> None:
    """Promise a body, send part of it, and break off: the client sees a protocol error."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"64")],
        }
    )
    await send({"type": "http.response.body", "body": b'{"dropped', "more_body": True})
    call.status = 0
    raise ConnectionDropped("connection dropped by an injected fault")
