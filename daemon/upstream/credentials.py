"""The account's credentials, held where a token rotation can swap them under load."""

from __future__ import annotations

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
    for the next request while calls already in flight finish with the old ones."""

    def __init__(self, credentials: Credentials) -> None:
        self._current = credentials

    @property
    def current(self) -> Credentials:
        return self._current

    def replace(self, credentials: Credentials) -> None:
        self._current = credentials
