"""`POST /callbacks` answered by the listener's protocol itself (ingest/protocol.py), and
the callbacks it leaves to the ASGI app: the same answers either way, over real sockets.

A callback pipelined behind a request not yet answered, or sent with `Expect:
100-continue`, goes the ASGI way; any other goes straight to the receiver.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from daemon.http.listener import limited_protocol
from daemon.http.serving import serve
from daemon.ingest.protocol import callback_protocol
from daemon.ingest.receiver import CallbackReceiver
from daemon.ingest.signature import Verifier
from daemon.metrics import Metrics
from daemon.settings import ListenerLimits
from daemon.store import Added, Callback
from daemon.store.sqlite import SQLiteStore
from tests.http.test_listener_limits import (
    Connection,
    _answers,
    _callback_request,
    _request_head,
    connection,
    served,
)
from tests.processes import Served
from tests.support import PUBLIC_URL, SIGNING_KEY_CURRENT, callback_json, signed

__all__ = ["served"]  # the fixture, shared with the listener's tests

_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: recoveryd\r\n\r\n"
_STATUS_LINE = re.compile(rb"HTTP/1\.1 \d{3} [^\r]*")


def _stored(tmp_path: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(tmp_path / "recoveryd.db")) as database:
        return {dlq_id for (dlq_id,) in database.execute("SELECT dlq_id FROM callbacks")}


async def _answer(conn: Connection) -> tuple[bytes, bytes]:
    """The next answer's head (without its `date` line) and body."""
    head = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), 5)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    body = await conn.reader.readexactly(length)
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]
    return b"\r\n".join(lines), body


def _invalid_request(dlq_id: str) -> bytes:
    body = json.dumps({"dlqId": dlq_id, "status": "not a number"}).encode()
    return _request_head(len(body), signed(body)) + b"\r\n" + body


async def test_each_answer_is_the_same_whichever_way_the_callback_went(served: Served) -> None:
    """Accepted, duplicate and invalid: the protocol's answer and the ASGI app's are the
    same bytes, but for the date and the dlqId. The ASGI ones are pipelined behind a
    probe, so they wait their turn."""
    ways: dict[bytes, list[tuple[bytes, bytes]]] = {b"direct": [], b"asgi__": []}
    for way, answers in ways.items():
        for request in (
            _callback_request(f"d-new-{way.decode()}"),
            _callback_request("d-new-direct"),  # a duplicate either way
            _invalid_request(f"d-bad-{way.decode()}"),
        ):
            async with connection(served, listen=False) as conn:
                if way == b"asgi__":
                    conn.write(_HEALTHZ)
                conn.write(request)
                if way == b"asgi__":
                    await _answer(conn)  # the probe's
                answers.append(await _answer(conn))
    direct, asgi = ways[b"direct"], ways[b"asgi__"]
    assert [head.split(b" ", 2)[1] for head, _ in direct] == [b"200", b"200", b"400"]
    assert json.loads(direct[0][1]) == {"status": "accepted", "dlqId": "d-new-direct"}
    assert json.loads(direct[1][1]) == {"status": "duplicate", "dlqId": "d-new-direct"}
    assert [(head, body.replace(b"asgi__", b"direct")) for head, body in asgi] == direct


async def test_a_callback_sent_with_expect_100_continue_is_stored(
    served: Served, tmp_path: Path
) -> None:
    """The client waits for `100 Continue` before its body (curl does for large bodies)."""
    body = callback_json("d-continue")
    async with connection(served, listen=False) as conn:
        conn.write(_request_head(len(body), signed(body) | {"Expect": "100-continue"}) + b"\r\n")
        interim = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), 5)
        conn.write(body)
        head, answer = await _answer(conn)
    assert interim.startswith(b"HTTP/1.1 100")
    assert head.startswith(b"HTTP/1.1 200")
    assert json.loads(answer) == {"status": "accepted", "dlqId": "d-continue"}
    assert "d-continue" in _stored(tmp_path)


async def test_an_http_1_0_callback_is_answered_and_the_connection_closed(
    served: Served,
) -> None:
    body = callback_json("d-http10")
    head = _request_head(len(body), signed(body)).replace(b"HTTP/1.1", b"HTTP/1.0", 1)
    async with connection(served) as conn:
        conn.write(head + b"\r\n" + body)
        status, data = await conn.answer()
    assert status == 200
    assert b"connection: close" in data.lower()
    assert data.endswith(b'{"status":"accepted","dlqId":"d-http10"}')


async def test_a_query_string_does_not_change_the_path(served: Served) -> None:
    body = callback_json("d-query")
    head = _request_head(len(body), signed(body)).replace(b"/callbacks", b"/callbacks?from=qstash")
    async with connection(served, listen=False) as conn:
        conn.write(head + b"\r\n" + body)
        head, answer = await _answer(conn)
    assert head.startswith(b"HTTP/1.1 200")
    assert json.loads(answer)["status"] == "accepted"


async def test_pipelined_callbacks_are_answered_in_order_and_all_stored(
    served: Served, tmp_path: Path
) -> None:
    """Ten callbacks in one write: the first goes to the protocol, the rest wait their
    turn the ASGI way; each answer is its own request's, in order."""
    dlq_ids = [f"d-order-{n}" for n in range(10)]
    async with connection(served, listen=False) as conn:
        conn.write(b"".join(_callback_request(dlq_id) for dlq_id in dlq_ids))
        answers = [await _answer(conn) for _ in dlq_ids]
    assert [json.loads(body)["dlqId"] for _, body in answers] == dlq_ids
    assert set(dlq_ids) <= _stored(tmp_path)


async def test_a_sender_gone_before_its_answer_leaves_the_callback_stored(
    served: Served, tmp_path: Path
) -> None:
    """Hung up right after sending: the callback is stored all the same (the service
    retries it and finds a duplicate), and the next sender is served as usual."""
    async with connection(served, listen=False) as conn:
        conn.write(_callback_request("d-gone"))
        await conn.writer.drain()
    async with connection(served, listen=False) as conn:
        conn.write(_callback_request("d-after"))
        (head,) = await _answers(conn, 1)
    assert head.startswith(b"HTTP/1.1 200")
    for _ in range(50):
        if {"d-gone", "d-after"} <= _stored(tmp_path):
            break
        await asyncio.sleep(0.1)
    assert {"d-gone", "d-after"} <= _stored(tmp_path)
    assert '"level": "error"' not in served.logs()


class _BrokenStore:
    """A store with a defect: `add_callback` raises, or its future fails, with a
    RuntimeError (not StoreUnavailable, which the service is told to retry)."""

    def __init__(self, *, at_once: bool) -> None:
        self._at_once = at_once

    def add_callback(self, callback: Callback) -> asyncio.Future[Added]:
        if self._at_once:
            raise RuntimeError("the store's defect")
        failed: asyncio.Future[Added] = asyncio.get_running_loop().create_future()
        failed.set_exception(RuntimeError("the store's defect"))
        return failed


@dataclass
class _Receiving:
    url: str
    metrics: Metrics
    asgi_requests: list[str]  # the paths of the requests that reached the ASGI app


class _SlowStore:
    """A store whose every commit takes `seconds`: keeps nothing but the dlqIds."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self.added: list[str] = []

    def add_callback(self, callback: Callback) -> asyncio.Future[Added]:
        self.added.append(callback.dlq_id)
        committed: asyncio.Future[Added] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(self._seconds, committed.set_result, "accepted")
        return committed


@contextlib.asynccontextmanager
async def _receiving(
    store: object, limits: ListenerLimits | None = None
) -> AsyncIterator[_Receiving]:
    """`store` behind a receiver and the protocol (`limits`, else the defaults), in
    this process."""
    metrics = Metrics(CollectorRegistry())
    receiver = CallbackReceiver(
        store=store,  # type: ignore[arg-type]  # add_callback is all the receiver uses
        metrics=metrics,
        verifier=Verifier((SIGNING_KEY_CURRENT.encode(),), "Service", PUBLIC_URL),
        allow_unsigned=False,
        header_prefix="Service",
        max_body_bytes=1024 * 1024,
    )
    protocol = limited_protocol(
        limits or ListenerLimits(), "public", lambda _: None, callback_protocol(receiver)
    )

    asgi_requests: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            asgi_requests.append(scope["path"])
            await receiver(scope, receive, send)
        elif scope["type"] == "websocket":  # refused: 403
            await send({"type": "websocket.close"})
        elif (await receive())["type"] == "lifespan.startup":  # serve() runs the lifespan
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})

    async with serve(app, http=protocol) as url:
        yield _Receiving(url, metrics, asgi_requests)


async def test_only_a_callback_that_needs_the_asgi_cycle_goes_that_way(tmp_path: Path) -> None:
    """Callbacks on a keep-alive connection never reach the ASGI app; one pipelined
    behind another does, and one sent with `Expect: 100-continue`."""
    async with (
        SQLiteStore.open(tmp_path / "store.db") as store,
        _receiving(store) as receiving,
        httpx.AsyncClient(base_url=receiving.url) as client,
    ):
        for n in range(3):
            body = callback_json(f"d-kept-alive-{n}")
            response = await client.post("/callbacks", content=body, headers=signed(body))
            assert response.status_code == 200
        assert receiving.asgi_requests == []
        body = callback_json("d-continue")
        headers = signed(body) | {"Expect": "100-continue"}
        response = await client.post("/callbacks", content=body, headers=headers)
        assert response.status_code == 200
        assert receiving.asgi_requests == ["/callbacks"]
        host, port = receiving.url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(_callback_request("d-first") + _callback_request("d-behind"))
        for _ in range(2):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
        writer.close()
        assert receiving.asgi_requests == ["/callbacks", "/callbacks"]
        assert await store.get_callback("d-behind") is not None


async def test_a_defect_in_the_store_is_a_500_and_the_connection_closes() -> None:
    """Whether the store raises or its future fails: 500, counted as `error`, and the
    connection ends (nothing is known of its state)."""
    for at_once in (True, False):
        async with _receiving(_BrokenStore(at_once=at_once)) as receiving:
            body = callback_json("d-defect")
            async with httpx.AsyncClient(base_url=receiving.url) as client:
                response = await client.post("/callbacks", content=body, headers=signed(body))
            metrics = receiving.metrics
        assert response.status_code == 500
        assert response.json() == {"error": "recoveryd failed to store the callback"}
        assert response.headers["connection"] == "close"
        assert metrics.callbacks["error"]._value.get() == 1


async def _raw_answers(url: str, data: bytes, count: int) -> list[bytes]:
    """The status lines of the answers to `data`, sent in one write, once `count` have
    come or the connection has closed or gone quiet for 5 s."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    received = b""
    with contextlib.suppress(TimeoutError, ConnectionError):
        while len(_STATUS_LINE.findall(received)) < count and (
            chunk := await asyncio.wait_for(reader.read(65536), 5)
        ):
            received += chunk
    writer.close()
    return _STATUS_LINE.findall(received)


_UPGRADE = (
    b"GET /ws HTTP/1.1\r\nHost: recoveryd\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
)


async def test_an_upgrade_pipelined_behind_a_callback_leaves_its_answer_alone() -> None:
    """An upgrade request makes no request cycle in uvicorn: its end must not be taken
    for the end of the callback before it (which was then answered again, 401). The
    callback is stored and counted once, accepted."""
    store = _SlowStore(0.3)
    async with _receiving(store) as receiving:
        lines = await _raw_answers(receiving.url, _callback_request("d-ws") + _UPGRADE, 2)
        await asyncio.sleep(0.5)
    assert b"HTTP/1.1 401 Unauthorized" not in lines
    assert store.added == ["d-ws"]
    counted = {result: child._value.get() for result, child in receiving.metrics.callbacks.items()}
    assert counted == {result: float(result == "accepted") for result in counted}


async def test_a_callback_after_a_refusal_in_the_same_read_is_not_cut_off_as_idle() -> None:
    """A refusal answered at once, then a callback whose commit outlasts the keep-alive
    timeout, in one write: the callback is answered, not closed on as an idle connection."""
    async with _receiving(_SlowStore(1.5), ListenerLimits(keepalive_timeout=1)) as receiving:
        data = _invalid_request("d-refused") + _callback_request("d-slow")
        lines = await _raw_answers(receiving.url, data, 2)
    assert lines == [b"HTTP/1.1 400 Bad Request", b"HTTP/1.1 200 OK"]
