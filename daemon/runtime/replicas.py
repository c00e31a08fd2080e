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
keep to the smallest part. Each part lapses half a lease after the beat that gave it
began: a replica whose heartbeat fails or stalls that long sends nothing more, since
the others may soon count it gone and take its part.

The same half lease fences what it sends (`LeaseFence`): the store's checks (a batch's
owner, a lease's) are made before a call, and a call's client may retry for longer than
a lease (its retry budget is 120 s). So every attempt of a batch's call also asks the
fence, which holds only while the lease this replica last renewed has half of it left,
and only in the term the batch was marked in: once the lease may have lapsed, the
replica stops sending for the batches it held until the store says again which are its.
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
from daemon.runtime.supervisor import Supervisor
from daemon.store import Store, StoreUnavailable
from daemon.store.records import Replica
from daemon.upstream import RateLimiter

log = structlog.get_logger(__name__)


def replica_id() -> str:
    """An id no other process, here or on another host, has had: host, pid and a nonce
    (a restarted pod may reuse its pid)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseFence:
    """Whether this replica may still send for the work it holds in a shared store.

    The heartbeat tells it of each renewal (`renewed`, with the monotonic time the beat
    began: the store counts the lease from then). It holds until half the lease has
    passed since the last renewal, within one term: a renewal that comes after it stopped
    holding starts a new term, since other replicas may have taken the work meanwhile
    (they do after a whole lease, by their own clocks: the other half is the margin for
    those clocks and for a call that was just let go). A store that is not shared has
    no one to take the work: its fence always holds.
    """

    def __init__(
        self, lease: float, *, shared: bool = True, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._half = lease / 2
        self._shared = shared
        self._clock = clock
        self._renewed = -math.inf
        self._term = 0
        self._renewal = asyncio.Event()

    def renewed(self, at: float) -> None:
        """A heartbeat that began at `at` (monotonic) was recorded in the store."""
        if at > self._renewed + self._half:  # it had stopped holding: a new term
            self._term += 1
        self._renewed = max(self._renewed, at)
        self._renewal.set()
        self._renewal = asyncio.Event()

    def term(self) -> int | None:
        """The term to send in, while the fence holds; None when it does not."""
        return self._term if self.holds(self._term) else None

    def holds(self, term: int) -> bool:
        """Whether something begun in `term` may still be sent: asked before every attempt."""
        if not self._shared:
            return True
        return term == self._term and self._clock() <= self._renewed + self._half

    async def renewal(self, at_most: float) -> None:
        """Return at the next renewal, or after `at_most` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(at_most):
                await self._renewal.wait()


class Heartbeat:
    def __init__(
        self,
        store: Store,
        replica: str,
        metrics: Metrics,
        *,
        lease: float = 30.0,
        limiter: RateLimiter | None = None,
        fence: LeaseFence | None = None,
        on_gone: Callable[[list[str]], None] = lambda gone: None,
        supervisor: Supervisor | None = None,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`fence` is told of every renewal, and `limiter` given its part till when, both
        timed by `clock` (the limiter's clock too)."""
        self._store = store
        self._replica = replica
        self._metrics = metrics
        self._lease = lease
        self._limiter = limiter
        self._fence = fence
        self._on_gone = on_gone
        self._supervisor = supervisor or Supervisor(metrics)
        self._wall_clock = wall_clock
        self._started = wall_clock()
        self._clock = clock
        self._began = -math.inf  # when the last beat began (monotonic)
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
            # A beat a third of the lease after the last one began, however long that one
            # took: the fence counts from when a beat begins.
            await asyncio.sleep(max(0.0, self._began + self._lease / 3 - self._clock()))
            try:
                await self._beat()
            except StoreUnavailable as exc:
                if not self._failing:
                    log.warning("heartbeat not recorded; other replicas take this one's "
                                "work if it lasts", error=str(exc), lease=self._lease)  # fmt: skip
                self._failing = True

    async def _beat(self) -> None:
        now, began = self._wall_clock(), self._clock()
        self._began = began
        gone = await self._store.heartbeat(self._replica, self._lease, now)
        self._failing = False
        if self._fence is not None:
            self._fence.renewed(began)
        if gone:
            log.warning("replicas gone; their leases and batches are taken up",
                        replicas=gone)  # fmt: skip
            self._on_gone(gone)
        alive = await self._store.replicas(now)
        self._metrics.replicas.set(max(1, len(alive)))
        if self._shared and self._limiter is not None:
            # The limiter's clock is this heartbeat's (both monotonic, as the fence's).
            self._limiter.share(*share_of(self._replica, alive), until=began + self._lease / 2)

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
