"""The service client's own cost: calls/s through ServiceClient against bare httpx.

Both sides read the same DLQ message from the same emulator over one loopback socket,
interleaved in rounds so that drift on a noisy machine hits both alike.
Run: python -m bench.client [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from daemon.emulator import EmulatorConfig, create_app
from daemon.serving import serve_in_thread
from daemon.upstream import Credentials, CredentialsHolder, ServiceClient


async def _rate(call: object, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        await call()  # type: ignore[operator]
    return calls / (time.perf_counter() - started)


async def main(calls: int, rounds: int) -> None:
    config = EmulatorConfig()
    with serve_in_thread(create_app(config)) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            seeded = await http.post(
                "/_emulator/dlq", json={"messages": [{"url": "https://a.test"}]}
            )
            dlq_id = seeded.json()["dlqIds"][0]
            auth = {"Authorization": f"Bearer {config.token}"}
            client = ServiceClient(
                http, base_url=url, credentials=CredentialsHolder(Credentials(config.token))
            )

            async def bare() -> None:
                response = await http.get(f"/v2/dlq/{dlq_id}", headers=auth)
                response.raise_for_status()
                response.json()

            async def through_client() -> None:
                await client.get_dlq_message(dlq_id)

            await _rate(bare, 50)  # warm up both paths
            await _rate(through_client, 50)
            bare_rates, client_rates = [], []
            for _ in range(rounds):
                bare_rates.append(await _rate(bare, calls))
                client_rates.append(await _rate(through_client, calls))
    bare_rate, client_rate = statistics.median(bare_rates), statistics.median(client_rates)
    print(f"bare httpx:     {bare_rate:8.0f} calls/s (median of {rounds} rounds of {calls})")
    print(f"ServiceClient:  {client_rate:8.0f} calls/s")
    print(f"ratio:          {client_rate / bare_rate:8.2f}")
    print(f"client cost:    {(1 / client_rate - 1 / bare_rate) * 1e6:8.0f} us per call")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.rounds))
