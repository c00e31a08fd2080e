"""Where rotated credentials are kept: a file of one daemon's, or the shared store, sealed.

A token reset invalidates the old token at once, so the new one is saved before use
(rotation.py) where a restart, and every other replica, will find it:

* `FileVault`: RECOVERYD_CREDENTIALS_FILE (credentials_file.py), one daemon's;
* `StoreVault`: the PostgreSQL store's `credentials` row, sealed with Fernet (AES-128-CBC
  and HMAC-SHA256, from `cryptography`) under RECOVERYD_CREDENTIALS_KEY, so that the
  database, its backups and its operators see no token; every replica reads it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol, runtime_checkable

from cryptography.fernet import Fernet, InvalidToken

from daemon.account import credentials_file
from daemon.account.credentials_file import CredentialsFileError, Saved
from daemon.store import StoreUnavailable


class Vault(Protocol):
    # Whether other replicas read it too (and so must follow what a rotation saves).
    shared: bool

    async def read(self) -> Saved | None:
        """The saved credentials; None before the first save. CredentialsFileError when
        they cannot be read."""
        ...

    async def write(self, saved: Saved) -> None:
        """Save `saved`, durably when this returns; CredentialsFileError when it cannot."""
        ...

    def check_writable(self) -> None:
        """CredentialsFileError if a save would surely fail (checked before a reset)."""
        ...


@runtime_checkable
class CredentialsStore(Protocol):
    """A store that keeps the sealed credentials (PostgreSQL's)."""

    async def load_credentials(self) -> bytes | None: ...

    async def save_credentials(self, sealed: bytes, rotation: int | None, now: float) -> None: ...


class FileVault:
    shared = False

    def __init__(self, path: Path) -> None:
        self.path = path

    async def read(self) -> Saved | None:
        return credentials_file.read(self.path)

    async def write(self, saved: Saved) -> None:
        credentials_file.write(self.path, saved)

    def check_writable(self) -> None:
        credentials_file.check_writable(self.path)


class StoreVault:
    shared = True

    def __init__(self, store: CredentialsStore, key: str) -> None:
        self._store = store
        self._fernet = Fernet(key)

    async def read(self) -> Saved | None:
        try:
            sealed = await self._store.load_credentials()
        except StoreUnavailable as exc:
            raise CredentialsFileError(
                f"cannot read the credentials from the store: {exc}"
            ) from None
        if sealed is None:
            return None
        try:
            raw = self._fernet.decrypt(sealed)
        except InvalidToken:
            raise CredentialsFileError(
                "the credentials in the store do not open with RECOVERYD_CREDENTIALS_KEY "
                "(sealed under another key?)"
            ) from None
        return credentials_file.loads(raw, "the store's credentials")

    async def write(self, saved: Saved) -> None:
        sealed = self._fernet.encrypt(credentials_file.dumps(saved))
        try:
            await self._store.save_credentials(sealed, saved.rotation, time.time())
        except StoreUnavailable as exc:
            raise CredentialsFileError(f"cannot save the credentials in the store: {exc}") from None

    def check_writable(self) -> None:
        return None  # the store answered the rotation's record just before
