"""The public listener against hostile clients, over real sockets to `recoveryd serve`.

Each attack test runs while an honest client on its own thread keeps sending signed
callbacks: every one of those must be answered 200 within a second, and the daemon's
resident memory must grow by less than RSS_GROWTH_BOUND.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.processes import Served, serving
from tests.support import callback_json, signed

# Small limits keep each test short; the defaults are documented in docs/settings.md.
LIMITS = {
    "HEADER_TIMEOUT": "1s",
    "KEEPALIVE_TIMEOUT": "1s",
    "BODY_TIMEOUT": "1s",
    "MAX_HEADER_BYTES": "16384",
    "MAX_CONNECTIONS": "400",
    "LOG_FORMAT": "json",
}
# What an attack may add to the daemon's resident memory: the listener buffers at most
# one read (256 KiB) past the header limit per connection and nothing of an unsigned body.
RSS_GROWTH_BOUND = 64 * 1024 * 1024


@dataclass
class Honest:
    """Signed callbacks every 50 ms on one keep-alive connection, from a thread of its own
    (the attack runs on the test's event loop); what came back, and how long it took."""

    url: str
    answers: list[tuple[int, float]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5) as client:
            n = 0
            while not self._stop.wait(0.05):
                n += 1
                body = callback_json(f"honest-{threading.get_ident()}-{n}")
                started = time.perf_counter()
                try:
                    response = client.post("/callbacks", content=body, headers=signed(body))
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                    continue
                self.answers.append((response.status_code, time.perf_counter() - started))

    def check(self) -> None:
        assert not self.failures, self.failures[:3]
        assert len(self.answers) >= 3, "the honest client hardly ran"
        statuses = {status for status, _ in self.answers}
        assert statuses == {200}, statuses
        slowest = max(seconds for _, seconds in self.answers)
        assert slowest < 1.0, f"an honest callback took {slowest:.2f} s"


@contextlib.contextmanager
def honest_client(url: str) -> Iterator[Honest]:
    honest = Honest(url)
    thread = threading.Thread(target=honest.run, daemon=True)
    thread.start()
    try:
        yield honest
    finally:
        deadline = time.monotonic() + 5  # a short attack: let it send a few more
        while len(honest.answers) < 3 and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.05)
        honest._stop.set()
        thread.join(10)
    honest.check()


def rss(served: Served) -> int:
    status = Path(f"/proc/{served.process.pid}/status").read_text()
    kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(kib) * 1024


@contextlib.contextmanager
def bounded_memory(served: Served) -> Iterator[None]:
    before = rss(served)
    yield
    grown = rss(served) - before
    assert grown < RSS_GROWTH_BOUND, f"RSS grew by {grown / 2**20:.0f} MiB"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with serving(tmp_path, **LIMITS) as served:
        yield served


def _address(served: Served) -> tuple[str, int]:
    host, port = served.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


@dataclass
class Connection:
    """A raw connection; everything the daemon sends is read as it arrives (read later,
    an answer could be lost to the reset that a refused sender's writes provoke)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    received: asyncio.Task[bytes] | None = None
    data: bytearray = field(default_factory=bytearray)  # what has arrived so far

    def listen(self) -> None:
        self.received = asyncio.create_task(_everything(self.reader, self.data))

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    async def answer(self, within: float = 5) -> tuple[int, bytes]:
        """The status and all the daemon sent, once it has closed the connection."""
        assert self.received is not None
        data = await asyncio.wait_for(asyncio.shield(self.received), within)
        assert data, "the connection was closed without an answer"
        return int(data.split(b" ", 2)[1]), data

    def answered(self) -> bool:
        """The daemon has begun to answer (a client that reads as it sends sees this)."""
        return bool(self.data) or (self.received is not None and self.received.done())


async def _everything(reader: asyncio.StreamReader, data: bytearray) -> bytes:
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(65536):
            data += chunk
    return bytes(data)


@contextlib.asynccontextmanager
async def connection(served: Served, *, listen: bool = True) -> AsyncIterator[Connection]:
    reader, writer = await asyncio.open_connection(*_address(served))
    opened = Connection(reader, writer)
    if listen:
        opened.listen()
    try:
        yield opened
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        if opened.received is not None:
            opened.received.cancel()


async def trickle(conn: Connection, data: bytes, pause: float) -> None:
    """Send `data` a byte at a time, `pause` apart, until sent or answered."""
    with contextlib.suppress(ConnectionError):
        for byte in data:
            if conn.answered():
                return
            conn.write(bytes([byte]))
            await conn.writer.drain()
            await asyncio.sleep(pause)


def _request_head(body_length: int, headers: dict[str, str], extra: str = "") -> bytes:
    lines = [
        "POST /callbacks HTTP/1.1",
        "Host: recoveryd",
        f"Content-Length: {body_length}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n" + extra).encode()


async def test_an_oversized_header_is_answered_431_and_closed(served: Served) -> None:
    """A header block over RECOVERYD_MAX_HEADER_BYTES: 431, the connection closed."""
    async with connection(served) as conn:
        conn.write(_request_head(2, {"X-Padding": "a" * 20000}) + b"\r\n{}")
        status, answer = await conn.answer()
    assert status == 431
    assert b"connection: close" in answer.lower()
    assert "header_too_large" in served.logs()


async def test_a_100_mb_header_is_cut_off_early_and_honest_callbacks_flow(
    served: Served,
) -> None:
    """A header that never ends is refused once it passes the limit, not read whole: the
    431 comes while the sender is still in its first megabytes (the rest sits in socket
    buffers), and the connection is dropped soon after."""
    with honest_client(served.url), bounded_memory(served):
        async with connection(served) as conn:
            conn.write(_request_head(0, {}) + b"X-Padding: ")
            sent = 0
            with contextlib.suppress(ConnectionError):
                while sent < 100 * 2**20 and not conn.answered():
                    conn.write(b"a" * 2**16)
                    await conn.writer.drain()
                    await asyncio.sleep(0)  # reading as it sends, as a client must
                    sent += 2**16
            status, _ = await conn.answer()
    assert status == 431
    assert sent < 32 * 2**20, f"{sent / 2**20:.0f} MiB were sent before the refusal"


async def test_a_body_over_the_limit_is_refused_before_it_is_sent(served: Served) -> None:
    """Content-Length over RECOVERYD_MAX_BODY_BYTES: 413 before a byte of the body, for
    each of 200 signed requests at once, while honest callbacks flow."""
    body = callback_json("d-big")

    async def oversized() -> tuple[int, bytes]:
        async with connection(served) as conn:
            conn.write(_request_head(10 * 2**20, signed(body)) + b"\r\n")
            return await conn.answer()

    with honest_client(served.url), bounded_memory(served):
        answers = await asyncio.wait_for(asyncio.gather(*(oversized() for _ in range(200))), 20)
    assert {status for status, _ in answers} == {413}
    assert all(b"connection: close" in answer.lower() for _, answer in answers)


async def test_a_bad_signature_is_refused_before_the_body_is_read(served: Served) -> None:
    """The token is checked from the headers alone: a forged one is refused at once,
    with the body still unsent."""
    body = callback_json("d-forged")
    forged = signed(body, key="not-the-signing-key-0123456789abcdef")
    async with connection(served) as conn:
        conn.write(_request_head(len(body), forged) + b"\r\n")
        status, answer = await conn.answer()
    assert status == 401  # not the 408 of RECOVERYD_BODY_TIMEOUT: answered without the body
    assert b"does not match any signing key" in answer


async def test_an_expired_token_is_refused_before_the_body_is_read(served: Served) -> None:
    body = callback_json("d-expired")
    stale = signed(body, now=time.time() - 3600)
    async with connection(served) as conn:
        conn.write(_request_head(len(body), stale) + b"\r\n")
        status, answer = await conn.answer()
    assert status == 401  # not the 408 of RECOVERYD_BODY_TIMEOUT: answered without the body
    assert b"expired" in answer


async def test_a_signed_token_over_another_body_is_refused_once_the_body_is_read(
    served: Served,
) -> None:
    """Only the body hash waits for the body."""
    body = callback_json("d-swapped")
    other = callback_json("d-other")
    async with connection(served, listen=False) as conn:
        conn.write(_request_head(len(other), signed(body)) + b"\r\n" + other)
        head = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 401")
    assert b"connection: close" not in head.lower()  # the body was read: the connection stays


async def test_a_slow_body_is_answered_408_and_closed(served: Served) -> None:
    """Signed callbacks whose bodies trickle in past RECOVERYD_BODY_TIMEOUT: 408 for each
    of 100 at once, while honest callbacks flow."""
    body = callback_json("d-slow")

    async def slow() -> tuple[int, bytes, float]:
        async with connection(served) as conn:
            conn.write(_request_head(len(body), signed(body)) + b"\r\n")
            started = time.monotonic()
            await trickle(conn, body, pause=0.1)
            status, answer = await conn.answer()
            return status, answer, time.monotonic() - started

    with honest_client(served.url), bounded_memory(served):
        answers = await asyncio.wait_for(asyncio.gather(*(slow() for _ in range(100))), 20)
    assert {status for status, _, _ in answers} == {408}
    assert max(seconds for _, _, seconds in answers) < 3
    assert all(b"connection: close" in answer.lower() for _, answer, _ in answers)
    assert "body_timeout" in served.logs()


async def test_slowloris_connections_are_answered_408_and_honest_callbacks_flow(
    served: Served,
) -> None:
    """200 connections each sending a header byte every 200 ms are cut at
    RECOVERYD_HEADER_TIMEOUT while honest callbacks go on."""
    head = _request_head(0, {"X-A": "b" * 100})

    async def loris() -> int:
        async with connection(served) as conn:
            await trickle(conn, head, pause=0.2)
            status, _ = await conn.answer()
            return status

    with honest_client(served.url), bounded_memory(served):
        statuses = await asyncio.wait_for(asyncio.gather(*(loris() for _ in range(200))), 20)
    assert set(statuses) == {408}
    assert "header_timeout" in served.logs()


async def test_idle_connections_are_closed_and_do_not_shut_honest_callers_out(
    tmp_path: Path,
) -> None:
    """More idle connections than RECOVERYD_MAX_CONNECTIONS: the oldest idle ones make
    room for new ones, the rest close at the header deadline, and honest callbacks on
    fresh connections are answered throughout. (A header deadline of some seconds: with
    one second, a loaded machine opening the connections saw the first ones closed by it
    before the cap was reached, and nothing evicted.)"""
    limits = LIMITS | {"MAX_CONNECTIONS": "100", "HEADER_TIMEOUT": "5s"}
    with serving(tmp_path, **limits) as served:
        async with contextlib.AsyncExitStack() as stack:
            idle = [await stack.enter_async_context(connection(served)) for _ in range(300)]
            with honest_client(served.url), bounded_memory(served):
                for n in range(10):  # new connections while the idle ones are held
                    body = callback_json(f"d-fresh-{n}")
                    async with httpx.AsyncClient(base_url=served.url) as fresh:
                        answer = await fresh.post("/callbacks", content=body, headers=signed(body))
                    assert answer.status_code == 200
                received = [conn.received for conn in idle if conn.received is not None]
                await asyncio.wait_for(asyncio.gather(*received), 20)  # every one closed
        assert "evicted" in served.logs()


async def test_a_connection_is_closed_after_its_last_allowed_request(tmp_path: Path) -> None:
    """RECOVERYD_MAX_REQUESTS_PER_CONNECTION=3: the third answer says close, and closes."""
    with serving(tmp_path, MAX_REQUESTS_PER_CONNECTION="3") as served:
        async with connection(served, listen=False) as conn:
            for n in range(3):
                body = callback_json(f"d-keep-{n}")
                conn.write(_request_head(len(body), signed(body)) + b"\r\n" + body)
                head = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), 5)
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await conn.reader.readexactly(length)
                assert (b"connection: close" in head.lower()) == (n == 2)
            assert await asyncio.wait_for(conn.reader.read(), 5) == b""


async def test_unsigned_slow_bodies_cost_no_memory(served: Served) -> None:
    """1,000 connections each announcing a 1 MiB body with a forged token: each is refused
    from its headers, and the daemon's memory does not grow with them."""

    async def forger() -> int:
        async with connection(served) as conn:
            headers = signed(b"x", key="not-the-signing-key-0123456789abcdef")
            conn.write(_request_head(2**20 - 1, headers) + b"\r\n" + b"{" * 65536)
            status, _ = await conn.answer()
            return status

    with honest_client(served.url), bounded_memory(served):
        statuses = []
        for _ in range(4):
            statuses += await asyncio.wait_for(asyncio.gather(*(forger() for _ in range(250))), 30)
    assert set(statuses) == {401}


def _callback_request(dlq_id: str, padding: int = 0) -> bytes:
    body = callback_json(dlq_id, **({"padding": "p" * padding} if padding else {}))
    return _request_head(len(body), signed(body)) + b"\r\n" + body


async def _answers(conn: Connection, count: int) -> list[bytes]:
    """The heads of the next `count` answers on a keep-alive connection."""
    heads = []
    for _ in range(count):
        head = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), 5)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await conn.reader.readexactly(length)
        heads.append(head)
    return heads


async def test_pipelined_callbacks_with_large_bodies_are_all_answered(served: Served) -> None:
    """Three callbacks of 20 KB sent in one write: each body is its own request's, not
    counted against the next one's headers."""
    async with connection(served, listen=False) as conn:
        conn.write(b"".join(_callback_request(f"d-pipe-{n}", 20_000) for n in range(3)))
        heads = await _answers(conn, 3)
    assert [head.split(b" ", 2)[1] for head in heads] == [b"200"] * 3


async def test_a_refusal_of_a_pipelined_request_follows_the_answer_before_it(
    served: Served,
) -> None:
    """A callback, then a request with headers over the limit, in one write: the callback
    is answered 200, then the 431 comes, and the connection closes."""
    async with connection(served, listen=False) as conn:
        too_large = _request_head(0, {"X-Padding": "a" * 20_000}) + b"\r\n"
        conn.write(_callback_request("d-before") + too_large)
        (first,) = await _answers(conn, 1)
        rest = await asyncio.wait_for(conn.reader.read(), 5)
    assert first.startswith(b"HTTP/1.1 200")
    assert rest.startswith(b"HTTP/1.1 431")


async def test_an_idle_keep_alive_connection_is_closed_without_an_answer(
    served: Served,
) -> None:
    """Past the header deadline with no byte of a new request, the connection is closed
    silently: a 408 there would be read as the answer to the client's next request."""
    async with connection(served, listen=False) as conn:
        conn.write(_callback_request("d-idle"))
        await _answers(conn, 1)
        assert await asyncio.wait_for(conn.reader.read(), 5) == b""


async def test_a_kept_alive_connection_outlasts_the_clients_idle_time(tmp_path: Path) -> None:
    """With the default settings, a connection idle for 6 s after an answer still takes
    the next request: a server that closes idle connections before its clients do (httpx
    keeps them 5 s, Go 90 s) races the request a client sends on one as it closes, and
    that request fails (the soak saw a callback lost to a ReadError that way)."""
    with serving(tmp_path) as served:
        async with connection(served, listen=False) as conn:
            conn.write(_callback_request("d-kept-1"))
            await _answers(conn, 1)
            await asyncio.sleep(6)
            conn.write(_callback_request("d-kept-2"))
            (second,) = await _answers(conn, 1)
    assert second.startswith(b"HTTP/1.1 200")


async def test_a_slow_request_on_a_kept_alive_connection_meets_the_header_deadline(
    tmp_path: Path,
) -> None:
    """The header deadline of a kept-alive connection's next request runs from its first
    byte: idle first, then slow, it is still answered 408."""
    # A keep-alive timeout well past the idle time: a stall of the test must not turn the
    # idle pause into a closed connection.
    with serving(tmp_path, **(LIMITS | {"KEEPALIVE_TIMEOUT": "10s"})) as served:
        async with connection(served, listen=False) as conn:
            conn.write(_callback_request("d-kept-slow"))
            await _answers(conn, 1)
            await asyncio.sleep(0.8)  # idle, within RECOVERYD_KEEPALIVE_TIMEOUT
            conn.listen()
            await trickle(conn, _request_head(0, {"X-A": "b" * 100}), pause=0.2)
            status, _ = await conn.answer()
    assert status == 408


async def test_an_answer_before_the_body_is_followed_by_nothing_else(served: Served) -> None:
    """A PUT answered 405 before its body arrived: the rest of the body is read and
    dropped, and no second answer (a 408) follows on the connection."""
    async with connection(served) as conn:
        conn.write(b"PUT /callbacks HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        await asyncio.sleep(1.5)
        with contextlib.suppress(ConnectionError):
            conn.write(b"defghij")
        status, answer = await conn.answer()
    assert status == 405
    assert answer.count(b"HTTP/1.1") == 1


async def test_lingering_refusals_make_room_for_honest_callers(tmp_path: Path) -> None:
    """Connections refused from their headers and lingering are the first to go when the
    listener is full: they cannot be used to shut honest callers out."""
    with serving(tmp_path, **(LIMITS | {"MAX_CONNECTIONS": "20"})) as served:
        forged = signed(b"x", key="not-the-signing-key-0123456789abcdef")
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(20):
                conn = await stack.enter_async_context(connection(served))
                conn.write(_request_head(2**20, forged) + b"\r\n" + b"{" * 100_000)
                assert (await conn.answer(within=5))[0] == 401
            body = callback_json("d-honest")
            async with httpx.AsyncClient(base_url=served.url) as client:
                response = await client.post("/callbacks", content=body, headers=signed(body))
        assert response.status_code == 200
