"""The service client's own cost: calls/s through ServiceClient against bare httpx.

Both sides read the same DLQ message from the same emulator (its own process, so it
does not share our GIL) over one loopback connection, call by call, alternating which
side goes first, so that drift on a noisy machine hits both alike.
Run: python -m bench.client [--calls N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator

import httpx

from daemon.upstream import Credentials, CredentialsHolder, ServiceClient

TOKEN = "tok_bench"


@contextlib.contextmanager
def emulator_process() -> Iterator[str]:
    """`recoveryd emulator` on a free loopback port, as its own process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = os.environ | {"EMULATOR_TOKEN": TOKEN, "EMULATOR_PASSWORD": "pw_bench"}
    command = [sys.executable, "-m", "daemon", "emulator", "--port", str(port)]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/_emulator/stats")
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the emulator did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(10)


async def _timed(call: Callable[[], Awaitable[None]]) -> float:
    started = time.perf_counter()
    await call()
    return time.perf_counter() - started


async def main(calls: int) -> None:
    with emulator_process() as url:
        async with httpx.AsyncClient(base_url=url) as http:
            seeded = await http.post(
                "/_emulator/dlq", json={"messages": [{"url": "https://a.test"}]}
            )
            dlq_id = seeded.json()["dlqIds"][0]
            auth = {"Authorization": f"Bearer {TOKEN}"}
            client = ServiceClient(
                http, base_url=url, credentials=CredentialsHolder(Credentials(TOKEN))
            )

            async def bare() -> None:
                response = await http.get(f"/v2/dlq/{dlq_id}", headers=auth)
                response.raise_for_status()
                response.json()

            async def through_client() -> None:
                await client.get_dlq_message(dlq_id)

            for _ in range(50):  # warm up both paths
                await bare()
                await through_client()
            bare_times: list[float] = []
            client_times: list[float] = []
            for i in range(calls):  # call by call, alternating who goes first
                pair = (bare, through_client) if i % 2 else (through_client, bare)
                for call in pair:
                    elapsed = await _timed(call)
                    (bare_times if call is bare else client_times).append(elapsed)
    bare_s, client_s = statistics.median(bare_times), statistics.median(client_times)
    print(f"bare httpx:     {1 / bare_s:8.0f} calls/s   p50 {bare_s * 1e6:6.0f} us ({calls} calls)")
    print(f"ServiceClient:  {1 / client_s:8.0f} calls/s   p50 {client_s * 1e6:6.0f} us")
    print(f"ratio:          {bare_s / client_s:8.2f}   (client rate / bare rate)")
    print(f"client cost:    {(client_s - bare_s) * 1e6:8.0f} us per call (p50 difference)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    asyncio.run(main(args.calls))
