"""How a loop over the store waits while the store does not answer."""

from __future__ import annotations

import asyncio

import structlog

from daemon.store.interface import StoreUnavailable

log = structlog.get_logger(__name__)


class StoreBackoff:
    """The pause of one loop (`loop` names it in the log) after StoreUnavailable: 1 s,
    doubling up to 30 s, so the loop never spins; `reset` once the store answers again."""

    def __init__(self, loop: str) -> None:
        self._loop = loop
        self._failures = 0

    async def pause(self, exc: StoreUnavailable) -> None:
        self._failures += 1
        log.warning(f"{self._loop}: store unavailable", error=str(exc))
        await asyncio.sleep(min(30.0, 0.5 * 2**self._failures))

    def reset(self) -> None:
        self._failures = 0
