"""The supervisor: a crashed task is logged once, counted, restarted with backoff, and
reported down in the status until it runs again."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from daemon.metrics import Metrics
from daemon.runtime.supervisor import Supervisor


async def test_a_crashed_task_is_restarted_and_counted() -> None:
    """Two crashes, then the work finishes: three runs, two crashes counted and logged
    with their type, and the waits between them grow."""
    metrics = Metrics(CollectorRegistry())
    waits: list[float] = []
    runs = 0

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async def work() -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise ValueError(f"boom {runs}")

    supervisor = Supervisor(metrics, base=1.0, sleep=sleep, rand=lambda: 1.0)
    with capture_logs() as logs:
        await supervisor.spawn("fetch-1", work)
    assert runs == 3
    assert waits == [1.0, 2.0]
    crashes = [line for line in logs if line["event"] == "task crashed; restarting it"]
    assert [(line["task"], line["error_type"]) for line in crashes] == [
        ("fetch-1", "ValueError")
    ] * 2
    sample = metrics.registry.get_sample_value("recoveryd_task_crashes_total", {"task": "fetch-1"})
    assert sample == 2


async def test_a_task_s_crashes_are_exported_at_zero_from_its_start() -> None:
    """A task that has not crashed has its series at 0, for rate() to see a first crash."""
    metrics = Metrics(CollectorRegistry())
    running = asyncio.Event()

    async def work() -> None:
        running.set()
        await asyncio.Event().wait()

    async with Supervisor(metrics).running("heartbeat", work):
        await running.wait()
        sample = metrics.registry.get_sample_value(
            "recoveryd_task_crashes_total", {"task": "heartbeat"}
        )
        assert sample == 0


async def test_a_task_is_reported_down_until_it_runs_again() -> None:
    """While a task waits for its restart, the status names it and why; then it clears."""
    release = asyncio.Event()
    crashed = asyncio.Event()

    async def sleep(seconds: float) -> None:
        crashed.set()
        await release.wait()

    calls = 0

    async def work() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("escaped")
        await asyncio.Event().wait()  # runs for ever

    supervisor = Supervisor(sleep=sleep)
    task = supervisor.spawn("batcher", work)
    await crashed.wait()
    down = (await supervisor.status())["tasks"]["down"]
    assert list(down) == ["batcher"]
    assert down["batcher"].startswith("RuntimeError, restarting in ")
    release.set()
    await asyncio.sleep(0)
    assert await supervisor.status() == {"tasks": {"down": {}}}
    task.cancel()
