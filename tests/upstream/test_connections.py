"""The service client's connections: kept while busy, dropped before a server drops them.

A call sent on a kept connection at the moment the server closes it for idling gets no
answer (httpx's RemoteProtocolError). For a bulk call that is an outcome unknown, which
costs a check of every dlqId in it; CI saw it when a batch waited out uvicorn's 5 s
keep-alive, the same 5 s httpx keeps an idle connection by default.
"""

from __future__ import annotations

import asyncio
from typing import Any

from daemon.http.serving import serve
from daemon.upstream import IDLE_CONNECTION_EXPIRY, service_http

# uvicorn's keep-alive, which the emulator (and many a service behind it) keeps.
UVICORN_IDLE_TIMEOUT = 5.0


async def _client_port(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers with the client's port: the same port is the same connection."""
    if scope["type"] != "http":
        return
    body = str(scope["client"][1]).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


async def test_a_busy_connection_is_kept_and_an_idle_one_dropped_before_the_server_would() -> None:
    assert IDLE_CONNECTION_EXPIRY < UVICORN_IDLE_TIMEOUT - 2  # margin for a loaded machine
    async with serve(_client_port) as url, service_http(timeout=5.0) as http:

        async def port() -> str:
            return (await http.get(url)).text

        first = await port()
        assert await port() == first, "a connection in use is kept"
        await asyncio.sleep(IDLE_CONNECTION_EXPIRY + 0.5)
        assert await port() != first, "a connection idle past the expiry is not reused"
