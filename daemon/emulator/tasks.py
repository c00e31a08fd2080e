"""The emulator's background work (deliveries, runs, callbacks), tracked so it can be awaited."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

log = structlog.get_logger("daemon.emulator")


class Background:
    """Tasks started by the emulator; `idle` waits for all of them, `cancel` ends them."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, object], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._logged(work, name), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @staticmethod
    async def _logged(work: Coroutine[Any, Any, object], name: str) -> None:
        # Nobody awaits these tasks' results, so an error would otherwise vanish.
        try:
            await work
        except Exception as exc:
            log.error("emulator.background_failed", task=name, error=type(exc).__name__)

    async def idle(self) -> None:
        """Wait until no task is left; tasks may start others, which are waited for too."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def cancel(self) -> None:
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
