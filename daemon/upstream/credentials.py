"""The account's credentials, held where a token rotation can swap them under load."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
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
    """The current credentials. Each call reads them afresh, so a swap takes effect
    for the next request while calls already in flight finish with the old ones.

    A rotation runs inside `rotating()`: from just before the reset until the new
    credentials are saved and swapped in, the old token may already be refused. A
    call refused in that gap waits for `settled()` and then tries the new token,
    instead of failing.
    """

    def __init__(self, credentials: Credentials) -> None:
        self._current = credentials
        self._settled = asyncio.Event()
        self._settled.set()

    @property
    def current(self) -> Credentials:
        return self._current

    def replace(self, credentials: Credentials) -> None:
        self._current = credentials

    @contextlib.asynccontextmanager
    async def rotating(self) -> AsyncIterator[None]:
        """Mark a rotation under way until the block ends (swapped or given up)."""
        if not self._settled.is_set():
            raise RuntimeError("a rotation is already under way")
        self._settled.clear()
        try:
            yield
        finally:
            self._settled.set()

    async def settled(self) -> None:
        """Wait until no rotation is under way."""
        await self._settled.wait()
