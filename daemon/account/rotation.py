"""Token rotation: on a schedule or on demand, saved before use, one at a time.

The reset invalidates the old token and password at once and its answer is the only
copy of the new ones, so a rotation goes in this order, each step durable before the
next:

1. record the rotation as under way in the store;
2. hold new calls back and let those in flight finish (`CredentialsHolder.rotating`);
3. call the reset with the basic credentials;
4. save the new credentials in the vault (vault.py): the credentials file (atomic,
   0600, fsync'd), or the PostgreSQL store, sealed, where every replica reads them;
5. swap them in, let calls through, and record the rotation's result.

When the reset's outcome is unknown (a timeout, a lost connection, a 5xx, an answer
without a token) the token in hand tells: if the service still takes it, the reset did
not happen (`failure`); if it refuses it, the service has credentials recoveryd never
received (`lockout`). A locked-out daemon makes no call at all (each could only be
refused, and a stream of refused calls can get an account blocked), says so in its
gauge, status and log (not in readiness: callbacks are still stored), and re-reads the
credentials file until an operator puts a token that works there.

A restart that finds a rotation recorded as under way resolves it the same way, except
that credentials saved by that very rotation (their `rotation` id) settle it as a
success.

With the store as the vault, the other replicas follow: they read the saved credentials
every `follow` seconds, and at once when the service refuses a call (after waiting
for a rotation recorded as under way to end), so a replica goes on with a token the
service has revoked for one refused call at most.

The operator's side of it: docs/operating.md, Token rotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from daemon.account import credentials_file
from daemon.account.credentials_file import CredentialsFileError, Saved
from daemon.account.vault import Vault
from daemon.foundation.schedule import parse_schedule
from daemon.metrics import ACCOUNT_LIMITS, Metrics
from daemon.runtime.supervisor import Supervisor
from daemon.store import Store, StoreUnavailable
from daemon.store.records import Rotation, RotationResult
from daemon.upstream import (
    AccountRecord,
    Credentials,
    CredentialsHolder,
    ServiceClient,
    ServiceError,
)
from daemon.upstream.errors import surely_not_carried_out

log = structlog.get_logger(__name__)

LOCKOUT_HELP = (
    "recoveryd makes no calls until a token that works is in hand: reset the token in the "
    "service's console and give it to `recoveryd set-token --from -` on its standard "
    "input, which saves it to the credentials file and has the daemon take it up"
)
SHARED_LOCKOUT_HELP = (
    "recoveryd makes no calls until a token that works is in hand: get one from the "
    "service's console and give it to `recoveryd set-token --from -` on its standard "
    "input; it is sealed into the store and every replica takes it up"
)


@dataclass(frozen=True)
class RotationTiming:
    """The rotation's waits; the defaults suit production, tests make them short."""

    drain: float = 5.0  # how long the reset waits for calls in flight to finish
    check_first: float = 1.0  # first wait before asking again whether the token works
    check_max: float = 300.0
    save_retry: float = 5.0  # between attempts to save new credentials
    lockout_poll: float = 30.0  # how often a locked-out daemon re-reads the file
    shutdown_wait: float = 20.0  # how long a stop waits for a rotation under way
    follow: float = 5.0  # how often a replica reads the shared vault for a new token
    catch_up: float = 30.0  # how long a refused call waits for another's rotation to end


class RotationRefused(Exception):
    """A rotation cannot start; `str()` says why."""


class Rotator:
    def __init__(
        self,
        client: ServiceClient,
        holder: CredentialsHolder,
        store: Store,
        metrics: Metrics,
        *,
        vault: Vault | None,
        schedule: str = "",
        timing: RotationTiming | None = None,
        supervisor: Supervisor | None = None,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._supervisor = supervisor or Supervisor(metrics)
        self._client = client
        self._holder = holder
        self._store = store
        self._metrics = metrics
        self._vault = vault
        self._schedule = schedule
        self._timing = timing or RotationTiming()
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._busy = asyncio.Lock()
        self._trouble: str | None = None  # why calls cannot be made, while they cannot
        # The end of a rotation the store could not record yet: id, result, reason, when.
        self._unrecorded: tuple[int, RotationResult, str | None, float] | None = None
        self._checking: asyncio.Task[None] | None = None
        self._dlq_retention: float | None = None
        client.on_refused = self.token_refused
        # Told when a lockout ends (the pipeline makes the work that waited for it due).
        self.on_unlocked: Callable[[], None] | None = None
        if vault is not None and vault.shared:
            holder.refresh = self.catch_up

    @property
    def schedule(self) -> str:
        return self._schedule

    def problems(self) -> list[str]:
        """Why the daemon cannot call the service (for the status); empty when it can. Read
        each time: a rotation or a token written to the credentials file may bring a token
        that the start did not have."""
        problems = [self._trouble] if self._trouble else []
        if not self._holder.current.token:
            problems.append(
                "no token: set RECOVERYD_TOKEN or RECOVERYD_TOKEN_FILE, or write it to the "
                "credentials file"
            )
        return problems

    def adopt(self, limits: dict[str, int]) -> None:
        """Use the account's limits: the rate limit for calls, the rest as metrics."""
        self._client.limiter.learn(limits.get("max_requests_per_second"), "account")
        self._metrics.set_account_limits(limits)
        retention = limits.get("max_dlq_retention_time_milis")
        if retention is not None:
            self._dlq_retention = retention / 1000

    def dlq_retention(self) -> float | None:
        """How long the service keeps a DLQ message (seconds), once it has said so."""
        return self._dlq_retention

    # -- running: the start's check, the schedule, the lockout watch --------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Rotator]:
        """Resolve a rotation a crash cut short, run the schedule, and watch a lockout
        for a token that works, for the block."""
        success = await self._store.last_rotation_success()
        if success is not None:  # before the first rotation the gauge stays absent
            self._metrics.last_rotation_success.set(success)
        failure = await self._store.last_rotation_failure()
        if failure is not None:  # likewise before the first failure
            self._metrics.last_rotation_failure.set(failure)
        tasks = [self._supervisor.spawn("rotation", self._recover_then_watch)]
        scheduler = None
        if self._schedule:
            scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop())
            scheduler.add_job(
                self._scheduled,
                parse_schedule(self._schedule),
                max_instances=1,
                coalesce=True,
                misfire_grace_time=300,
            )
            scheduler.start()
        try:
            yield self
        finally:
            # A rotation under way (scheduled or asked for) finishes if it can: cut short
            # after its reset, it may be a lockout at the next start.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._timing.shutdown_wait), self._busy:
                    pass
            if scheduler is not None:
                scheduler.shutdown(wait=False)
            if self._checking is not None:
                tasks.append(self._checking)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _scheduled(self) -> None:
        try:
            await self.rotate()
        except RotationRefused as exc:
            log.warning("scheduled token rotation not started", reason=str(exc))

    async def _recover_then_watch(self) -> None:
        wait = self._timing.check_first
        while True:
            try:
                await self.recover()
                break
            except StoreUnavailable as exc:
                log.warning("cannot read the last rotation yet; trying again", error=str(exc))
            await self._sleep(wait)
            wait = min(wait * 2, self._timing.check_max)
        while True:
            await self._sleep(self._timing.lockout_poll)
            if self._holder.locked_out:
                try:
                    await self._look_for_a_working_token()
                except StoreUnavailable as exc:
                    log.warning("cannot record the end of the lockout yet", error=str(exc))

    async def recover(self) -> None:
        """Resolve what the store says about the last rotation: one under way (a crash cut
        it short) or a lockout not yet over. Calls are held back meanwhile."""
        latest = await self._store.latest_rotation()
        if latest is None or not (latest.under_way or latest.locked_out):
            return
        async with self._busy, self._holder.rotating(drain_seconds=0):
            saved = await self._read_saved()
            if latest.under_way and saved is not None and saved.rotation == latest.id:
                outcome: tuple[RotationResult, str | None] = (
                    "success",
                    "cut short after its new credentials were saved; they are in use",
                )
            elif latest.under_way:
                outcome = await self._find_out("it was cut short (recoveryd stopped)")
            elif await self._token_works_eventually():
                await self._store.resolve_lockout(self._wall_clock())
                log.info("token lockout over: the token in hand works")
                return
            else:
                self._lock_out("the token in hand is still refused")
                return
        if latest.under_way:
            await self._finish(latest.id, *outcome)

    async def _look_for_a_working_token(self) -> None:
        saved = await self._read_saved()
        if saved is None or saved.credentials.token == self._holder.current.token:
            return
        try:
            works = await self._client.token_works(saved.credentials)
        except ServiceError as exc:
            log.warning("cannot check the credentials file's new token yet", error=str(exc))
            return
        if not works:
            log.error("the credentials file's new token is refused too; still locked out")
            return
        self._unlock(credentials_file.merged(saved.credentials, self._holder.current))
        self.adopt(saved.limits)
        with contextlib.suppress(StoreUnavailable):
            await self._store.resolve_lockout(self._wall_clock())
        log.info("token lockout over: the credentials file has a token that works")

    def token_refused(self) -> None:
        """A call was refused with no rotation under way to explain it: the token may have
        been reset or revoked outside recoveryd. One check; a refusal there locks out, so
        the pipeline stops spending its tries on calls that can only be refused."""
        if self._holder.locked_out or self._busy.locked():
            return
        if self._checking is None or self._checking.done():
            self._checking = asyncio.create_task(self._check_refused_token())

    async def _check_refused_token(self) -> None:
        async with self._busy:
            checked = self._holder.current
            try:
                works = await self._client.token_works(checked)
            except ServiceError:
                return  # unknown: the next refused call asks again
            # The answer is about the token sent. Replaced while the check was out (another
            # replica's rotation, `recoveryd set-token`), the one in hand is not refused:
            # locked out holding it, the lockout watch (which looks for another) never ends.
            replaced = self._holder.current.token != checked.token
            if not works and not replaced and not self._holder.locked_out:
                self._lock_out(
                    "the service refuses the token and no rotation by recoveryd explains it "
                    "(reset or revoked elsewhere?)"
                )

    # -- one rotation -------------------------------------------------------------------

    async def rotate(self) -> Rotation:
        """Rotate the token now; the rotation's record once it has ended. RotationRefused
        when it cannot start (another under way, a lockout, credentials missing)."""
        if self._busy.locked():
            raise RotationRefused("a rotation or a token check is already under way")
        async with self._busy:
            self._check_ready()
            started = self._wall_clock()
            try:
                await self._record_unrecorded()
                rotation_id = await self._store.begin_rotation(started)
            except StoreUnavailable as exc:
                raise RotationRefused(f"the store cannot record the rotation: {exc}") from None
            if rotation_id is None:
                raise RotationRefused(
                    "another rotation is recorded as under way (another recoveryd process, "
                    "or one cut short that is not resolved yet)"
                )
            log.info("token rotation started", rotation=rotation_id)
            async with self._holder.rotating(self._timing.drain):
                result, reason = await self._reset_and_save(rotation_id)
            await self._finish(rotation_id, result, reason)
            return Rotation(rotation_id, started, self._wall_clock(), result, reason, None)

    def _check_ready(self) -> None:
        if self._holder.locked_out:
            raise RotationRefused(f"locked out: {self._trouble}")
        if self._vault is None:
            raise RotationRefused(
                "RECOVERYD_CREDENTIALS_FILE (or, with a PostgreSQL store, "
                "RECOVERYD_CREDENTIALS_KEY) is not set: the new token would be lost at the "
                "next restart"
            )
        try:
            self._vault.check_writable()
        except CredentialsFileError as exc:
            raise RotationRefused(f"the new credentials could not be saved: {exc}") from None
        missing = missing_basic_credentials(self._holder.current)
        if missing:
            raise RotationRefused(missing)

    async def _reset_and_save(self, rotation_id: int) -> tuple[RotationResult, str | None]:
        try:
            record = await self._client.rotate_token()
        except ServiceError as exc:
            if surely_not_carried_out(exc):
                return "failure", f"the service did not reset the token: {exc}"
            return await self._find_out(f"its answer was lost ({exc})")
        if record.token is None:
            return await self._find_out("the service's answer carries no token")
        old = self._holder.current
        new = Credentials(
            record.token.get_secret_value(),
            old.username,
            record.password.get_secret_value() if record.password else None,
        )
        if new.password is None:
            log.warning("the reset's answer carries no password: the next rotation will fail")
        saved = Saved(new, rotation_id, self._wall_clock(), _limits(record))
        await self._save(saved)
        self._holder.replace(new)
        self.adopt(saved.limits)
        return "success", None

    async def _save(self, saved: Saved) -> None:
        """Save the credentials, trying until it works: the old token is dead, and the new
        one must not be used before a restart (or another replica) could find it."""
        assert self._vault is not None
        while True:
            try:
                await self._vault.write(saved)
            except CredentialsFileError as exc:
                self._trouble = f"new credentials not saved yet: {exc}"
                log.error(
                    "token rotated but the new credentials cannot be saved; trying again",
                    error=str(exc),
                    in_seconds=self._timing.save_retry,
                )
                await self._sleep(self._timing.save_retry)
                continue
            self._trouble = None
            return

    async def _find_out(self, why: str) -> tuple[RotationResult, str | None]:
        """The outcome of a reset whose answer recoveryd does not have."""
        self._trouble = f"the reset's outcome is unknown ({why}): checking the token"
        # A reset whose answer timed out may still be under way at the service: a check
        # at once could find the old token working and miss the change.
        await self._sleep(self._timing.check_first)
        works = await self._token_works_eventually()
        self._trouble = None
        if works:
            return "failure", f"{why}, and the token in hand still works: the reset did not happen"
        reason = (
            f"{why}, and the token in hand is refused: the service has new credentials "
            "that recoveryd never received"
        )
        self._lock_out(reason)
        return "lockout", reason

    async def _token_works_eventually(self) -> bool:
        """Ask the service whether the token in hand works, until it answers (a read,
        harmless to repeat; with backoff, so never a hot loop)."""
        wait = self._timing.check_first
        while True:
            try:
                return await self._client.token_works()
            except ServiceError as exc:
                log.warning(
                    "cannot tell yet whether the token works; asking again",
                    error=str(exc),
                    in_seconds=wait,
                )
            await self._sleep(wait)
            wait = min(wait * 2, self._timing.check_max)

    def _lock_out(self, reason: str) -> None:
        self._holder.lock_out()
        self._trouble = f"locked out: {reason}"
        self._metrics.token_lockout.set(1)
        shared = self._vault is not None and self._vault.shared
        log.error(f"TOKEN LOCKOUT: {reason}. {SHARED_LOCKOUT_HELP if shared else LOCKOUT_HELP}")

    def _unlock(self, credentials: Credentials) -> None:
        """A token that works ends the lockout: calls go again, and the work refused
        meanwhile is told (`on_unlocked`), so it goes now rather than at its backoff's end."""
        self._holder.unlock(credentials)
        self._trouble = None
        self._metrics.token_lockout.set(0)
        if self.on_unlocked is not None:
            self.on_unlocked()

    async def _finish(self, rotation_id: int, result: RotationResult, reason: str | None) -> None:
        now = self._wall_clock()
        self._metrics.rotations[result].inc()
        if result == "success":
            self._metrics.last_rotation_success.set(now)
            log.info("token rotated", rotation=rotation_id, note=reason)
        elif result == "failure":
            self._metrics.last_rotation_failure.set(now)
            log.warning("token rotation failed", rotation=rotation_id, reason=reason)
        # Recorded with the time the gauges took, which a restart reads back.
        self._unrecorded = (rotation_id, result, reason, now)
        with contextlib.suppress(StoreUnavailable):  # recorded before the next rotation
            await self._record_unrecorded()

    async def _record_unrecorded(self) -> None:
        if self._unrecorded is not None:
            await self._store.finish_rotation(*self._unrecorded)
            self._unrecorded = None

    async def _read_saved(self) -> Saved | None:
        if self._vault is None:
            return None
        try:
            return await self._vault.read()
        except CredentialsFileError as exc:
            log.error("cannot read the saved credentials", error=str(exc))
            return None

    # -- following a rotation made by another replica (a shared vault) ------------------

    @contextlib.asynccontextmanager
    async def following(self) -> AsyncIterator[None]:
        """With a shared vault, take up what another replica's rotation saved, for the
        block: every replica runs this, the rotation on one of them at a time."""
        if self._vault is None or not self._vault.shared:
            yield
            return
        async with self._supervisor.running("credentials-follow", self._follow):
            yield

    async def _follow(self) -> None:
        while True:
            await self._sleep(self._timing.follow)
            await self._take_saved()

    async def catch_up(self) -> None:
        """A call was refused: another replica may have rotated the token. Wait while a
        rotation is recorded as under way (at most `catch_up` seconds), then take the
        saved credentials if they are new."""
        waited = 0.0
        with contextlib.suppress(StoreUnavailable):
            while waited < self._timing.catch_up:
                latest = await self._store.latest_rotation()
                if latest is None or not latest.under_way:
                    break
                await self._sleep(0.25)
                waited += 0.25
        await self._take_saved()

    async def _take_saved(self) -> None:
        if self._take(await self._read_saved()):
            log.info("new credentials taken from the store (a rotation saved them)")

    def _take(self, saved: Saved | None) -> bool:
        """Use `saved` if its token is not the one in hand (a lockout ends); whether it was."""
        current = self._holder.current
        if saved is None or saved.credentials.token == current.token:
            return False
        credentials = credentials_file.merged(saved.credentials, current)
        if self._holder.locked_out:
            self._unlock(credentials)
        else:
            self._holder.replace(credentials)
        self.adopt(saved.limits)
        return True

    # -- a token an operator saved (`recoveryd set-token`) ----------------------------

    async def take_saved_now(self) -> dict[str, Any]:
        """Take up the saved credentials at once: `recoveryd set-token` asks this once it
        has saved a token (checked with the service, unless told not to), so no check is
        made here; a token the service refuses locks out again at its first refusal.
        RotationRefused while a rotation or a token check is under way (the command
        refuses to save during one too); CredentialsFileError when the saved credentials
        cannot be read."""
        if self._vault is None:
            raise RotationRefused(
                "this daemon keeps no saved credentials (RECOVERYD_CREDENTIALS_FILE or "
                "RECOVERYD_CREDENTIALS_KEY is not set)"
            )
        if self._busy.locked():
            raise RotationRefused("a rotation or a token check is under way")
        async with self._busy:
            was_locked_out = self._holder.locked_out
            taken = self._take(await self._vault.read())
            if taken and was_locked_out:
                with contextlib.suppress(StoreUnavailable):
                    await self._store.resolve_lockout(self._wall_clock())
        if taken:
            log.info("the token saved by recoveryd set-token is in use",
                     lockout_ended=was_locked_out)  # fmt: skip
        return {"status": "taken" if taken else "unchanged", "lockedOut": self._holder.locked_out}

    # -- what /api/v1/status shows --------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        latest = await self._store.latest_rotation()
        return {
            "lastTokenRotation": latest.to_json() if latest else None,
            "token": {
                "lockedOut": self._holder.locked_out,
                "lastRotationSuccessAt": await self._store.last_rotation_success(),
                "rotateSchedule": self._schedule or None,
                "problems": self.problems(),
            },
        }


def missing_basic_credentials(credentials: Credentials) -> str | None:
    """Why the reset cannot be called with `credentials`, or None when it can."""
    if credentials.username and credentials.password:
        return None
    return (
        "the reset needs RECOVERYD_ACCOUNT_USERNAME and RECOVERYD_ACCOUNT_PASSWORD "
        "(or a credentials file that has them)"
    )


def _limits(record: AccountRecord) -> dict[str, int]:
    """The account's limits that its record carries, by their wire names (docs/metrics.md
    lists them; `timeout` is one too, and `max_` fields not listed yet are kept as well)."""
    fields = record.model_dump(exclude_none=True)
    return {
        name: value
        for name, value in fields.items()
        if (name.startswith("max_") or name in ACCOUNT_LIMITS)
        and isinstance(value, int)
        and not isinstance(value, bool)
    }
