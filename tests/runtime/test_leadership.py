"""The singleton jobs on one replica at a time: the PostgreSQL advisory lock on a
connection of its own, and Leadership running the jobs while it is held, stopping them
when it is lost and taking over when it is freed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import psycopg
from prometheus_client import CollectorRegistry

from daemon.metrics import Metrics
from daemon.runtime.leadership import Leadership
from daemon.store import Unshared
from daemon.store.postgres.singleton import SINGLETON_LOCK, AdvisoryLock

FAST = {"retry": 0.2, "check": 0.2}


@dataclass
class Job:
    """A singleton job that records when it runs."""

    running: bool = False
    starts: int = 0
    stops: int = 0
    events: list[str] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def __call__(self) -> AsyncIterator[None]:
        self.running, self.starts = True, self.starts + 1
        try:
            yield
        finally:
            self.running, self.stops = False, self.stops + 1


def holder_pid(url: str) -> int:
    """The backend holding the singleton lock."""
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND ((classid::bigint << 32) | objid::bigint) = %s",
            (SINGLETON_LOCK,),
        ).fetchone()
    assert row is not None, "nobody holds the lock"
    return int(row[0])


def terminate(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def until(condition: object, seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():  # type: ignore[operator]  # noqa: ASYNC110 (no event to wait on)
            await asyncio.sleep(0.05)


async def test_one_session_holds_the_lock_until_it_lets_go(postgres_url: str) -> None:
    first, second = AdvisoryLock(postgres_url), AdvisoryLock(postgres_url)
    try:
        assert await first.acquire() is True
        assert await second.acquire() is False
        assert await first.held() is True
        await first.release()
        assert await first.held() is False
        assert await second.acquire() is True
    finally:
        await first.release()
        await second.release()


async def test_the_job_runs_on_one_replica_and_moves_when_its_holder_is_cut_off(
    postgres_url: str,
) -> None:
    jobs = [Job(), Job()]
    metrics = [Metrics(CollectorRegistry()), Metrics(CollectorRegistry())]
    leaders = [
        Leadership(AdvisoryLock(postgres_url), [job], metric, **FAST)
        for job, metric in zip(jobs, metrics, strict=True)
    ]
    async with leaders[0].running(), leaders[1].running():
        await asyncio.sleep(0.6)  # three tries of the second at least
        assert [job.running for job in jobs] == [True, False]
        assert [leader.holding for leader in leaders] == [True, False]
        assert metrics[0].registry.get_sample_value("recoveryd_singleton_jobs_running") == 1
        assert metrics[1].registry.get_sample_value("recoveryd_singleton_jobs_running") == 0

        # The holder's session ends under it (a failover, a partition the server saw):
        # its next check fails and stops its job; the other takes the lock, and the job.
        terminate(postgres_url, holder_pid(postgres_url))
        await until(lambda: not jobs[0].running, seconds=10.0)
        await until(lambda: jobs[1].running, seconds=10.0)
        assert jobs[0].stops == 1
        assert [leader.holding for leader in leaders] == [False, True]
    assert [job.stops for job in jobs] == [1, 1]


async def test_a_store_of_one_daemon_runs_the_jobs_before_the_block_starts() -> None:
    job = Job()
    leader = Leadership(Unshared(), [job], Metrics(CollectorRegistry()), **FAST)
    async with leader.running():
        assert job.running
    assert job.stops == 1
