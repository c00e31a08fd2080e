"""The batches' waits for the service: backoffs that end when it is back, until a stop.

A batch waits out a backoff for the service, not for itself, so every such wait ends
early when a circuit closes (`back`) or when an open circuit lets a probe through
(docs/pipeline.md, Retries). It uses the service client's circuits and a clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from daemon.upstream import ServiceClient


class ServiceWaits:
    def __init__(self, client: ServiceClient, clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._clock = clock
        self._back = asyncio.Event()  # set, and replaced, when the service is back
        self.stopping = False  # the batcher stops: waits give up, work stays in the store

    def back(self) -> None:
        """The service answers again (a circuit closed): the batches waiting out a
        backoff for it go now."""
        self._back.set()
        self._back = asyncio.Event()

    async def pause(self, seconds: float, *operations: str) -> None:
        """Sleep `seconds`, or less: until the service is back, or until the open circuit
        of one of `operations` (those the batch's next step calls, or failed on) lets a
        probe through, as this batch may be the only work that would make it: the
        service's return would go unseen until some backoff ran out."""
        until = self._clock() + seconds
        while (left := until - self._clock()) > 0:
            states = self._client.breaker_states()
            for operation in operations:
                if states.get(operation) == "open":
                    retry_at = self._client.retry_at(operation)
                    if retry_at is None:
                        return
                    left = min(left, retry_at - self._clock())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._back.wait()
                    return

    async def answers(self, operation: str) -> bool:
        """Wait while the client holds `operation` back (its circuit is open): a call now
        would only be refused. False when the batcher stops meanwhile."""
        while (retry_at := self._client.retry_at(operation)) is not None:
            if self.stopping:
                return False
            await self.pause(max(0.05, min(1.0, retry_at - self._clock())), operation)
        return True
