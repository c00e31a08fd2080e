"""The account's credentials, held where a token rotation can swap them under load."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Credentials:
    """Bearer token for message operations; basic credentials for the token reset.

    The repr never shows a secret, so a credentials object can be logged safely.
    """

    token: str = field(repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)


class CredentialsHolder:
    """The current credentials, and a gate in front of the calls that use the token.

    A call takes the credentials with `using()`, which counts it in flight. A rotation
    runs inside `rotating()`: it closes the gate, so new calls wait, and lets the calls
    in flight finish (for a bounded time) before the reset, so that as few calls as
    possible carry a token the service has just stopped accepting. A call refused in the
    gap anyway (it outlasted the wait) waits for `settled()` and tries the new token.

    After a lockout (the old token refused, the new one never received) the gate stays
    closed until `unlock()` brings credentials that work: a call made with a refused
    token could only fail, and many refused calls can get an account blocked.
    """

    def __init__(self, credentials: Credentials) -> None:
        self._current = credentials
        self._open = asyncio.Event()
        self._open.set()
        self._rotating = False
        self._locked_out = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        # Reads credentials saved elsewhere (another replica's rotation), after a refusal.
        self.refresh: Callable[[], Awaitable[None]] | None = None

    @property
    def current(self) -> Credentials:
        return self._current

    @property
    def locked_out(self) -> bool:
        return self._locked_out

    @property
    def holding_back(self) -> bool:
        """Whether a rotation or a lockout holds new calls back now."""
        return not self._open.is_set()

    def replace(self, credentials: Credentials) -> None:
        self._current = credentials

    @contextlib.asynccontextmanager
    async def using(self) -> AsyncIterator[Credentials]:
        """The credentials for one request, once no rotation or lockout holds calls back."""
        while not self._open.is_set():  # closed again before this task resumed: wait on
            await self._open.wait()
        self._in_flight += 1
        self._idle.clear()
        try:
            yield self._current
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    @contextlib.asynccontextmanager
    async def rotating(self, drain_seconds: float = 5.0) -> AsyncIterator[None]:
        """Hold new calls back for the block, after up to `drain_seconds` for the calls in
        flight to finish. The gate opens again at the end unless `lock_out()` was called."""
        if self._rotating:
            raise RuntimeError("a rotation is already under way")
        self._rotating = True
        self._open.clear()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(drain_seconds):
                    await self._idle.wait()
            yield
        finally:
            self._rotating = False
            if not self._locked_out:
                self._open.set()

    def lock_out(self) -> None:
        """The token in hand is refused and there is no other: hold every call back."""
        self._locked_out = True
        self._open.clear()

    def unlock(self, credentials: Credentials) -> None:
        """Credentials that work again: swap them in and let calls through."""
        self._current = credentials
        self._locked_out = False
        if not self._rotating:
            self._open.set()

    async def settled(self) -> None:
        """Wait until no rotation or lockout holds calls back."""
        await self._open.wait()
