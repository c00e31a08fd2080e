"""The two baseline servers bench.ingest runs as their own processes.

`bare_app` is the least an ASGI app can do with a callback: read the body, answer 200
with a small JSON body. bench.ingest serves it with uvicorn and the settings recoveryd's
own listener uses, so the gap between the two is recoveryd's work and nothing else.

The raw server (`python -m bench.baselines --port P`) answers every request with one
fixed response without parsing it. It is as cheap a server as asyncio allows, so the rate
the load generator reaches against it is the generator's own ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

# recoveryd's answer to a bench.ingest callback, to the byte count.
BARE_BODY = b'{"status":"accepted","dlqId":"0000000000000-0000000"}'
_BARE_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(BARE_BODY)).encode("ascii")),
]

RAW_RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(BARE_BODY)).encode("ascii")
    + b"\r\n\r\n"
    + BARE_BODY
)
_END_OF_HEAD = b"\r\n\r\n"


async def bare_app(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    """Read the whole request body, as recoveryd must, then answer 200 with BARE_BODY."""
    if scope["type"] != "http":  # no lifespan: uvicorn runs with --lifespan off
        return
    while (await receive()).get("more_body", False):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": _BARE_HEADERS})
    await send({"type": "http.response.body", "body": BARE_BODY})


class _RawProtocol(asyncio.Protocol):
    """One RAW_RESPONSE per end of request head seen on the connection.

    Counting `\\r\\n\\r\\n` is enough because the benchmark's bodies are compact JSON.
    Up to three bytes after the last terminator are carried over, in case the next one
    straddles two reads.
    """

    def __init__(self) -> None:
        self._transport: asyncio.WriteTransport | None = None
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream socket's transport writes; uvloop's do not subclass asyncio's, hence a cast.
        self._transport = cast(asyncio.WriteTransport, transport)

    def data_received(self, data: bytes) -> None:
        seen = self._tail + data
        requests = seen.count(_END_OF_HEAD)
        after_last = seen.rfind(_END_OF_HEAD) + len(_END_OF_HEAD) if requests else 0
        self._tail = seen[after_last:][-3:]
        if requests and self._transport is not None:
            self._transport.write(RAW_RESPONSE * requests)


async def serve_raw(host: str, port: int) -> None:
    """Serve _RawProtocol on `host:port` until the process is stopped."""
    server = await asyncio.get_running_loop().create_server(_RawProtocol, host, port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description="The raw asyncio server of bench.ingest.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    import uvloop  # the fastest loop there is, so the server never limits the ceiling

    uvloop.run(serve_raw(args.host, args.port))


if __name__ == "__main__":
    main()
