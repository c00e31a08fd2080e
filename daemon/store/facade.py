"""The Store operations both engines run the same way, written once.

Each operation hands its engine's module function (the same module and function names
in sqlite/ and postgres/) to the engine's `_read` or `_write`, which runs it with a
connection: SQLite calls the sync function on its thread, PostgreSQL awaits the async
one on a pooled connection. An engine's facade adds only what differs by engine: how it
connects and commits, its health, and its replicas.
"""

# The engines' functions are reached through their modules, so their results are Any
# here: each operation's annotation, the Store interface's, is what both return.
# mypy: disable-error-code="no-any-return"

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from types import ModuleType
from typing import Any

from daemon.store import listing, records, replay
from daemon.store.group_commit import GroupCommit
from daemon.store.interface import Added, Callback, Page, RecordQuery, StoreUnavailable
from daemon.store.removals import Removal, RemovalResult
from daemon.store.sweep_records import PageEnd, RunStart, SweepResult, SweepRun

Work = Callable[..., Any]


class Facade(abc.ABC):
    """What SQLiteStore and PostgresStore share: callbacks written with group commit, a
    health timer, and every operation of daemon.store.Store whose work is one engine
    function (see there for what each does)."""

    # The engine's modules, one a concern.
    _pipeline: ModuleType
    _notify: ModuleType
    _retention: ModuleType
    _rotations: ModuleType
    _rate: ModuleType
    _sweeps: ModuleType
    _endpoints: ModuleType
    _listing: ModuleType
    _replay: ModuleType

    def __init__(
        self,
        *,
        observe_commit: Callable[[int], None] | None,
        max_pending: int,
        commit_timeout: float,
        read_timeout: float,
    ) -> None:
        self._commit_timeout = commit_timeout
        self._read_timeout = read_timeout
        self._callbacks = GroupCommit(
            self._insert,
            failed=self._commit_failed,
            committed=self._committed,
            observe_commit=observe_commit,
            max_pending=max_pending,
            commit_timeout=commit_timeout,
        )

    @contextlib.asynccontextmanager
    async def _running(self, health_interval: float, name: str) -> AsyncIterator[None]:
        """Group commit and the health timer (`_watch`) running for the block; then the
        callbacks still pending committed, and the engine's connections closed."""
        self._callbacks.start()
        watcher = asyncio.create_task(self._watch(health_interval), name=name)
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await self._close(finished=await self._callbacks.close())

    def add_callback(self, callback: Callback) -> asyncio.Future[Added]:
        if not self._callbacks.closing and (problems := self.problems()):
            # Refused at once, not queued: the commit would fail (the server away) or
            # land in a file that is gone. The service retries.
            raise StoreUnavailable("; ".join(problems))
        return self._callbacks.add(callback)

    @abc.abstractmethod
    def problems(self) -> list[str]:
        """What is wrong with the store now, one sentence each (see Store.problems)."""

    @abc.abstractmethod
    async def _watch(self, interval: float) -> None:
        """The health timer: every `interval` seconds, see whether a problem is over."""

    @abc.abstractmethod
    async def _insert(self, callbacks: list[Callback]) -> list[Added]:
        """Commit a batch of callbacks; for each, whether it was new (see Store.add_callback)."""

    @abc.abstractmethod
    def _commit_failed(self, exc: Exception) -> StoreUnavailable:
        """The error the callbacks of a commit that failed with `exc` get."""

    @abc.abstractmethod
    async def _close(self, *, finished: bool) -> None:
        """Close the engine's connections; `finished`: the last commit ended (a hung one
        may not have)."""

    def _committed(self, outcomes: list[Added]) -> None:
        """After a commit went through: what the engine notes then, if anything."""
        return None  # nothing, unless the engine says otherwise

    @abc.abstractmethod
    async def _read(self, work: Work, /, *args: Any, **kwargs: Any) -> Any:
        """`work(connection, *args, **kwargs)`, within the read timeout."""

    @abc.abstractmethod
    async def _write(self, work: Work, /, *args: Any, **kwargs: Any) -> Any:
        """`work(connection, *args, **kwargs)` in one transaction, within commit_timeout."""

    @abc.abstractmethod
    async def _adopting(self, work: Work, /, *args: Any) -> Any:
        """A read that may take over the work of replicas gone: a write where replicas
        share the store, a read where one daemon has it."""

    async def _pruned_chunk(self) -> None:
        """After each chunk `prune` deleted: what the engine does then, if anything."""
        return None  # nothing, unless the engine says otherwise

    async def _pruned(self) -> None:
        """After `prune` has deleted all it had to: what the engine does then, if anything."""
        return None  # nothing, unless the engine says otherwise

    # -- the pipeline's states -----------------------------------------------------

    async def get_callback(self, dlq_id: str) -> Callback | None:
        row = await self._read(self._pipeline.callback, dlq_id)
        return None if row is None else Callback(row[0], bytes(row[1]), row[2], bool(row[3]))

    async def inbox_depth(self) -> int:
        return await self._read(self._pipeline.inbox_depth)

    async def claim(
        self, owner: str, limit: int, lease: float, now: float, *, bodies: bool = False
    ) -> list[records.Claimed]:
        return await self._write(self._pipeline.claim, owner, limit, lease, now, bodies)

    async def settle(
        self, owner: str, outcomes: list[records.Outcome], now: float
    ) -> records.Settled:
        return await self._write(self._pipeline.settle, owner, outcomes, now)

    async def retry_now(self, now: float, limit: int | None = None) -> int:
        return await self._write(self._pipeline.retry_now, now, limit)

    async def pending(self, owner: str | None = None) -> list[records.Pending]:
        return await self._adopting(self._pipeline.pending, owner)

    async def open_batch(
        self, action: str, overrides: str, dlq_ids: list[str], now: float, owner: str | None = None
    ) -> records.BatchRecord | None:
        return await self._write(self._pipeline.open_batch, action, overrides, dlq_ids, now, owner)

    async def mark_sending(self, batch_id: int, now: float, owner: str | None = None) -> bool:
        return await self._write(self._pipeline.mark_sending, batch_id, now, owner)

    async def settle_batch(self, batch_id: int, **settlement: Any) -> records.Settled:
        end = records.BatchEnd(**settlement)
        return await self._write(self._pipeline.settle_batch, batch_id, end)

    async def unsettled_batches(self, owner: str | None = None) -> list[records.BatchRecord]:
        return await self._adopting(self._pipeline.unsettled_batches, owner)

    async def sends(self, dlq_ids: list[str]) -> dict[str, int]:
        return await self._read(self._pipeline.sends, dlq_ids)

    async def redrive(
        self, *, states: Sequence[str] = ("failed",), now: float, apply: bool, **which: Any
    ) -> list[str]:
        records.check_final(states)  # ValueError now, before any query
        # None: any rule, any time, any dlqId
        rule, since, dlq_ids = which.get("rule"), which.get("since"), which.get("dlq_ids")
        run = self._write if apply else self._read
        return await run(self._pipeline.redrive, states, rule, since, dlq_ids, now, apply)

    # -- the console's listings (listing.py) -------------------------------------------

    async def list_records(self, query: RecordQuery) -> Page:
        listing.records_sql(query, str)  # BadQuery now, before any query
        return await self._read(self._listing.records, query)

    async def lineage(self, dlq_id: str) -> list[dict[str, Any]]:
        return await self._read(self._listing.lineage, dlq_id)

    async def list_batches(
        self, state: str | None = None, cursor: str | None = None, limit: int = 50
    ) -> Page:
        listing.batches_sql(state, cursor, limit, str)  # BadQuery now, as above
        return await self._read(self._listing.batches, state, cursor, limit)

    async def failure_groups(self, limit: int = 100) -> list[dict[str, Any]]:
        listing.check_group_limit(limit)
        return await self._read(self._listing.groups, limit)

    async def rule_outcomes(self) -> dict[str, dict[str, int]]:
        return await self._read(self._listing.outcomes)

    async def activity(self, now: float, minutes: int = 60) -> dict[str, list[int]]:
        listing.check_minutes(minutes)
        return await self._read(self._listing.activity, now, minutes)

    # -- replay and the shadow rules (replay.py) ----------------------------------------

    async def replay_rows(
        self, since: float | None, after: tuple[float, str] | None, limit: int
    ) -> list[records.ReplayRow]:
        replay.rows_sql(since, after, limit, str)  # ValueError now, before any query
        return await self._read(self._replay.rows, since, after, limit)

    async def shadow_disagreements(self, since: float | None = None) -> list[dict[str, Any]]:
        return await self._read(self._replay.disagreements, since)

    # -- notifications -------------------------------------------------------------

    async def due_notifications(
        self, now: float, limit: int, skip_receivers: Sequence[str] = ()
    ) -> list[records.NotificationJob]:
        return await self._read(self._notify.due, now, limit, skip_receivers)

    async def begin_notification_attempt(
        self, notification_id: int, now: float, retry_at: float
    ) -> int | None:
        return await self._write(self._notify.begin_attempt, notification_id, now, retry_at)

    async def finish_notification_attempt(
        self, notification_id: int, result: records.NotificationResult, **attempt: Any
    ) -> bool:
        end = records.AttemptEnd(result, **attempt)
        return await self._write(self._notify.finish_attempt, notification_id, end)

    # -- retention -----------------------------------------------------------------

    async def prune(self, *, before: float, now: float, dedup_for: float, chunk: int = 200) -> int:
        """Delete the records final since before `before` (and the batches of none but
        them), `chunk` to a transaction so that no transaction holds many rows (nor a
        commit of callbacks waits for more than one chunk), keeping a key of each for
        `dedup_for` seconds; forget the keys kept long enough. How many were deleted."""
        until = now + dedup_for
        pruned = 0
        while True:
            # Each chunk is a transaction of its own: what queued meanwhile (a commit of
            # callbacks) runs before the next one.
            deleted = await self._write(
                self._retention.prune_chunk, before=before, until=until, chunk=chunk
            )
            pruned += deleted
            await self._pruned_chunk()
            if deleted < chunk:
                break
        while await self._write(self._retention.expire_chunk, now=now, chunk=chunk):
            pass
        await self._pruned()
        return pruned

    # -- token rotations -----------------------------------------------------------

    async def begin_rotation(self, now: float) -> int | None:
        return await self._write(self._rotations.begin, now)

    async def finish_rotation(
        self, rotation_id: int, result: records.RotationResult, reason: str | None, now: float
    ) -> None:
        await self._write(self._rotations.finish, rotation_id, result, reason, now)

    async def resolve_lockout(self, now: float) -> None:
        await self._write(self._rotations.resolve_lockout, now)

    async def unless_rotating(self, write: Callable[[], None]) -> bool:
        # Inside the write's transaction, which keeps a rotation from beginning meanwhile.
        return await self._write(self._rotations.unless_rotating, write)

    async def latest_rotation(self) -> records.Rotation | None:
        return await self._read(self._rotations.latest)

    async def last_rotation_success(self) -> float | None:
        return await self._read(self._rotations.last_success_at)

    async def last_rotation_failure(self) -> float | None:
        return await self._read(self._rotations.last_failure_at)

    # -- the account's learned rate limit --------------------------------------------

    async def learned_rate(self) -> records.LearnedRate | None:
        return await self._read(self._rate.load)

    async def save_learned_rate(self, learned: records.LearnedRate) -> None:
        await self._write(self._rate.save, learned)

    # -- sweep runs ------------------------------------------------------------------

    async def begin_sweep_run(self, sweep: str, **run: Any) -> int | None:
        return await self._write(self._sweeps.begin_run, sweep, RunStart(**run))

    async def begin_sweep_page(self, run_id: int, page: int, **asked: Any) -> None:
        await self._write(self._sweeps.begin_page, run_id, page, **asked)

    async def settle_sweep_page(self, run_id: int, page: int, **answer: Any) -> None:
        await self._write(self._sweeps.settle_page, run_id, page, PageEnd(**answer))

    async def finish_sweep_run(
        self, run_id: int, result: SweepResult, error: str | None, now: float
    ) -> None:
        await self._write(self._sweeps.finish_run, run_id, result, error, now)

    async def close_interrupted_sweep_runs(
        self, now: float, sweep: str | None = None
    ) -> list[SweepRun]:
        return await self._write(self._sweeps.close_interrupted, now, sweep)

    async def sweep_runs(self, sweep: str, limit: int) -> list[SweepRun]:
        return await self._read(self._sweeps.runs, sweep, limit)

    async def last_sweep_successes(self) -> dict[str, float]:
        return await self._read(self._sweeps.last_successes)

    # -- endpoint removals (failures are counted by settle) ----------------------------

    async def removals_due(self, now: float) -> list[Removal]:
        return await self._read(self._endpoints.due, now)

    async def defer_removal(self, removal_id: int, **deferred: Any) -> None:
        await self._write(self._endpoints.defer, removal_id, **deferred)

    async def intend_removal(self, removal_id: int, **intended: Any) -> Removal | None:
        return await self._write(self._endpoints.intend, removal_id, **intended)

    async def finish_removal(
        self, removal_id: int, result: RemovalResult, reason: str, **finished: Any
    ) -> bool:
        return await self._write(self._endpoints.finish, removal_id, result, reason, **finished)

    async def removals(self, group: str | None = None) -> list[dict[str, Any]]:
        return await self._read(self._endpoints.listed, group)

    async def begin_restore(self, group: str, name: str, now: float) -> Removal:
        return await self._write(self._endpoints.begin_restore, group, name, now)

    async def finish_restore(self, removal_id: int, **restored: Any) -> None:
        await self._write(self._endpoints.finish_restore, removal_id, **restored)
