"""This daemon among the replicas that share its store: its id, and its heartbeat.

Every lease, decided dlqId and batch a replica holds in the store carries its id. The
heartbeat renews the replica's life in the store every third of `lease`; a replica that
misses it for a whole `lease` (killed, partitioned, frozen) is declared gone by the
next heartbeat of another, and its work becomes theirs (store/postgres/replicas.py).
The lease is the one bound on a dead replica's work waiting, and must outlast the
longest a live one may go without reaching the store while a call of its is in flight.

The heartbeat also shares the account's rate limit out: each replica takes its part by
its rank among those alive (ratelimit.RateLimiter.share), so the parts add up to the
limit. A part only grows once every other replica has beaten since the last one joined
(and so knows of it): until then a replica that joined sends nothing, and the others
keep to the smallest part. A replica whose heartbeat fails for half its lease gives its
part up, since the others may soon count it gone and take it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog

from daemon.metrics import Metrics
from daemon.store import Store, StoreUnavailable
from daemon.store.records import Replica
from daemon.supervisor import Supervisor
from daemon.upstream import RateLimiter

log = structlog.get_logger(__name__)


def replica_id() -> str:
    """An id no other process, here or on another host, has had: host, pid and a nonce
    (a restarted pod may reuse its pid)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Heartbeat:
    def __init__(
        self,
        store: Store,
        replica: str,
        metrics: Metrics,
        *,
        lease: float = 30.0,
        limiter: RateLimiter | None = None,
        on_gone: Callable[[list[str]], None] = lambda gone: None,
        supervisor: Supervisor | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._replica = replica
        self._metrics = metrics
        self._lease = lease
        self._limiter = limiter
        self._on_gone = on_gone
        self._supervisor = supervisor or Supervisor(metrics)
        self._last_beat = -math.inf
        self._wall_clock = wall_clock
        self._started = wall_clock()
        self._failing = False
        self._shared = False  # whether other replicas may share the store: see running()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Beat for the block; at its end the replica leaves, its work anyone's at once.
        On a shared store no call goes out before a beat has given this replica its
        part of the rate limit."""
        self._shared = self._store.shared
        if self._shared and self._limiter is not None:
            self._limiter.share(0, 0)
        with contextlib.suppress(StoreUnavailable):  # else the loop's first beat does it
            await self._beat()
        try:
            async with self._supervisor.running("heartbeat", self._run):
                yield
        finally:
            try:
                await self._store.leave(self._replica)
            except StoreUnavailable as exc:
                log.warning("could not tell the store this replica leaves; its work waits "
                            "out its lease", error=str(exc), lease=self._lease)  # fmt: skip

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._lease / 3)
            try:
                await self._beat()
            except StoreUnavailable as exc:
                if not self._failing:
                    log.warning("heartbeat not recorded; other replicas take this one's "
                                "work if it lasts", error=str(exc), lease=self._lease)  # fmt: skip
                self._failing = True
                if (
                    self._limiter is not None
                    and self._shared
                    and (self._wall_clock() - self._last_beat > self._lease / 2)
                ):
                    self._limiter.share(0, 0)

    async def _beat(self) -> None:
        now = self._wall_clock()
        gone = await self._store.heartbeat(self._replica, self._lease, now)
        self._failing = False
        self._last_beat = now
        if gone:
            log.warning("replicas gone; their leases and batches are taken up",
                        replicas=gone)  # fmt: skip
            self._on_gone(gone)
        alive = await self._store.replicas(now)
        self._metrics.replicas.set(max(1, len(alive)))
        if self._shared and self._limiter is not None:
            self._limiter.share(*share_of(self._replica, alive))

    async def status(self) -> dict[str, Any]:
        """`/api/v1/status`'s part: the replicas alive (this daemon alone on a store of
        its own), each with its part of the account's rate limit, and which of them holds
        the singleton lock (runs rotation, sweeps, pruning, removals, notifications)."""
        now = self._wall_clock()
        if not self._store.shared:
            alone = Replica(self._replica, self._started, now)
            return {"replicas": [self._shown(alone, [alone])], "singletonHolder": self._replica}
        alive = await self._store.replicas(now)
        holder = await self._store.singleton_holder()
        if holder is not None:
            # The lock's session names the replica by the end of its id (63 bytes at most).
            holder = next((member.id for member in alive if member.id.endswith(holder)), holder)
        return {
            "replicas": [self._shown(member, alive) for member in alive],
            "singletonHolder": holder,
        }

    def _shown(self, member: Replica, alive: list[Replica]) -> dict[str, Any]:
        _, members = share_of(member.id, alive)
        return {
            "id": member.id,
            "startedAt": member.started_at,
            "seenAt": member.seen_at,
            # Whole calls a second each, so the parts may differ by one call.
            "share": round(1 / members, 4) if members else 0.0,
            "self": member.id == self._replica,
        }


def share_of(replica: str, alive: list[Replica]) -> tuple[int, int]:
    """(rank, members) of `replica` for its limiter, among the replicas `alive`: see the
    module's docstring."""
    ids = [member.id for member in alive]
    if replica not in ids:
        return 0, 0
    newest = max(member.started_at for member in alive)
    # One second of leeway for the clocks of different hosts.
    known = all(member.seen_at > newest + 1.0 for member in alive if member.id != replica)
    if known:
        return ids.index(replica), len(ids)
    mine = next(member for member in alive if member.id == replica)
    if mine.started_at == newest:
        return 0, 0
    return len(ids) - 1, len(ids)  # the smallest part
