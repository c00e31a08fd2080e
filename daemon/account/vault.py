"""Where rotated credentials are kept: a file of one daemon's, or the shared store, sealed.

A token reset invalidates the old token at once, so the new one is saved before use
(rotation.py) where a restart, and every other replica, will find it:

* `FileVault`: RECOVERYD_CREDENTIALS_FILE (credentials_file.py), one daemon's;
* `StoreVault`: the PostgreSQL store's `credentials` row, sealed with Fernet (AES-128-CBC
  and HMAC-SHA256, from `cryptography`) under RECOVERYD_CREDENTIALS_KEY, so that the
  database, its backups and its operators see no token; every replica reads it. The
  setting may hold several keys (MultiFernet): the first seals, any of them opens, so a
  key is changed without a moment where a replica cannot read the row (`reseal`).

An operator's token (`recoveryd set-token`) goes in with `replace`, which refuses while a
rotation is recorded as under way: that rotation's reset would revoke the token, and its
save would overwrite it (or be overwritten by it, with a token the service no longer
takes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from daemon.account import credentials_file
from daemon.account.credentials_file import CredentialsFileError, Saved
from daemon.settings import fernet_keys
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

    async def replace(self, saved: Saved) -> bool:
        """Save `saved` unless a rotation is recorded as under way (False, nothing saved);
        no rotation can begin meanwhile. CredentialsFileError when it cannot save."""
        ...


class RotationRecords(Protocol):
    """A store's records of rotations, as `replace` needs them (both engines')."""

    async def unless_rotating(self, write: Callable[[], None]) -> bool: ...


@runtime_checkable
class CredentialsStore(Protocol):
    """A store that keeps the sealed credentials (PostgreSQL's)."""

    async def load_credentials(self) -> bytes | None: ...

    async def save_credentials(self, sealed: bytes, rotation: int | None, now: float) -> None: ...

    async def replace_credentials(self, sealed: bytes, now: float) -> bool: ...

    async def reseal_credentials(self, rewrite: Callable[[bytes], bytes], now: float) -> bool: ...


class FileVault:
    shared = False

    def __init__(self, path: Path, records: RotationRecords | None = None) -> None:
        """`records`, the store's, are needed by `replace` only."""
        self.path = path
        self._records = records

    async def read(self) -> Saved | None:
        return credentials_file.read(self.path)

    async def write(self, saved: Saved) -> None:
        credentials_file.write(self.path, saved)

    def check_writable(self) -> None:
        credentials_file.check_writable(self.path)

    async def replace(self, saved: Saved) -> bool:
        assert self._records is not None, "FileVault.replace needs the store's records"
        try:
            return await self._records.unless_rotating(
                lambda: credentials_file.write(self.path, saved)
            )
        except StoreUnavailable as exc:
            raise CredentialsFileError(
                f"the store cannot tell whether a rotation is under way: {exc}"
            ) from None


class StoreVault:
    shared = True

    def __init__(self, store: CredentialsStore, keys: str) -> None:
        """`keys`: RECOVERYD_CREDENTIALS_KEY's value, one key or several comma-separated."""
        self._store = store
        self._fernet = MultiFernet([Fernet(key) for key in fernet_keys(keys)])

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
                "the credentials in the store open with none of RECOVERYD_CREDENTIALS_KEY's "
                "keys (sealed under another key? keep the old key after the new one until "
                "`recoveryd reseal` has run)"
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

    async def replace(self, saved: Saved) -> bool:
        sealed = self._fernet.encrypt(credentials_file.dumps(saved))
        try:
            return await self._store.replace_credentials(sealed, time.time())
        except StoreUnavailable as exc:
            raise CredentialsFileError(f"cannot save the credentials in the store: {exc}") from None

    async def reseal(self) -> bool:
        """Seal the saved credentials again under the first key, in one transaction (a
        rotation's save waits for it); False when none are saved. CredentialsFileError
        when no key opens them or the store cannot."""

        def rewrite(sealed: bytes) -> bytes:
            try:
                return self._fernet.rotate(sealed)
            except InvalidToken:
                raise CredentialsFileError(
                    "the credentials in the store open with none of RECOVERYD_CREDENTIALS_KEY's "
                    "keys: keep the key they were sealed with in the list (after the new one)"
                ) from None

        try:
            return await self._store.reseal_credentials(rewrite, time.time())
        except StoreUnavailable as exc:
            raise CredentialsFileError(
                f"cannot reseal the credentials in the store: {exc}"
            ) from None
