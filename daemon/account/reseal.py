"""`recoveryd reseal`: the credentials kept in the PostgreSQL store sealed again under the
first of RECOVERYD_CREDENTIALS_KEY's keys, so that an old key can leave the setting.

Changing the key goes: put the new key first and the old one after it (every replica
then seals with the new one and still opens what the old one sealed), roll the replicas,
run `recoveryd reseal`, then take the old key out. The row is rewritten in one
transaction that holds it, so a rotation saving new credentials meanwhile waits and then
wins; the credentials themselves never leave this process in clear.
"""

from __future__ import annotations

from daemon.account.credentials_file import CredentialsFileError
from daemon.account.vault import CredentialsStore, StoreVault
from daemon.settings import Settings, fernet_keys
from daemon.store import StoreUnavailable, open_store


class ResealError(Exception):
    """Nothing was resealed; `str()` is what to print."""


async def reseal(settings: Settings) -> str:
    """Reseal the store's credentials; the line to print, ResealError when it cannot."""
    if settings.CREDENTIALS_KEY is None:
        raise ResealError(
            "RECOVERYD_CREDENTIALS_KEY is not set: no credentials are sealed (the credentials "
            "file, RECOVERYD_CREDENTIALS_FILE, is plain JSON readable by its owner only)"
        )
    keys = settings.CREDENTIALS_KEY.get_secret_value()
    try:
        async with open_store(settings.STORE, release_leases=False, create=False) as store:
            if not isinstance(store, CredentialsStore):  # the settings' checks refuse it
                raise ResealError("RECOVERYD_CREDENTIALS_KEY: needs a PostgreSQL store")
            resealed = await StoreVault(store, keys).reseal()
    except StoreUnavailable as exc:
        raise ResealError(f"RECOVERYD_STORE: {exc}") from None
    except CredentialsFileError as exc:
        raise ResealError(str(exc)) from None
    if not resealed:
        return "no credentials are saved in the store yet: nothing to reseal"
    count = len(fernet_keys(keys))
    if count == 1:
        return "the saved credentials are sealed again under RECOVERYD_CREDENTIALS_KEY"
    return (
        f"the saved credentials are sealed under the first of RECOVERYD_CREDENTIALS_KEY's "
        f"{count} keys; the others may now leave the setting, on every replica"
    )
