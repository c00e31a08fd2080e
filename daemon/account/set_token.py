"""`recoveryd set-token`: put a token an operator got (from the service's console) where
recoveryd keeps its credentials, and have the running daemon take it up: the way out of
a lockout, or after a token was reset or revoked outside recoveryd.

The token is read from a file or standard input (`--from`), else from RECOVERYD_TOKEN or
RECOVERYD_TOKEN_FILE, never from an argument (which `ps` and the shell's history would
show). It is checked with the service first (one read that a good token answers 404 to),
so a token the service refuses is never saved, and then saved in the vault: sealed into
the PostgreSQL store with RECOVERYD_CREDENTIALS_KEY, or written to
RECOVERYD_CREDENTIALS_FILE. The save is refused while a rotation is recorded as under
way, and no rotation can begin during it: a rotation's reset would revoke the token.

A daemon running on RECOVERYD_ADMIN_LISTEN is then asked to take the saved credentials up
at once (`POST /-/reload-credentials`); with a shared store, the other replicas read them
within seconds (they follow the store's credentials every 5 s). A lockout recorded in
the store ends with the save, since the token was checked; a daemon that is not running
checks its token at its next start anyway. The token reaches the daemon through the
vault, never over HTTP.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from daemon.account import credentials_file
from daemon.account.credentials_file import CredentialsFileError, Saved
from daemon.account.vault import Vault
from daemon.admin.client import DaemonError, ask_daemon, daemon_admin
from daemon.settings import Settings, SettingsError, needs
from daemon.store import StoreUnavailable, open_store
from daemon.upstream import (
    Credentials,
    CredentialsHolder,
    RateLimiter,
    RetryPolicy,
    ServiceClient,
    ServiceError,
    service_http,
)

# Where the token comes from without --from: set-token's own need (daemon/cli.py).
TOKEN_GIVEN = needs(
    "TOKEN_FILE", "TOKEN", why="the token to save, unless --from names where it is (- for stdin)"
)
# A few tries, over seconds, not the pipeline's two minutes: someone waits at a prompt.
_CHECK_RETRY = RetryPolicy(max_attempts=3, max_elapsed=15.0)


class SetTokenError(Exception):
    """The token was not saved, or not taken up; `str()` is what to print."""


@dataclass(frozen=True)
class Given:
    """What the operator gave: a token, and the password and username when given too."""

    token: str = field(repr=False)
    password: str | None = field(default=None, repr=False)
    username: str | None = None


def read_given(source: str | None, settings: Settings) -> Given:
    """The token from `source` (a path, `-` for standard input), else from the settings.
    A source holds the bare token, or JSON as the credentials file has it
    ({"token": "...", "password": "..."}). SetTokenError when there is none, or it is
    malformed; the message never shows what was read."""
    if source is None:
        try:
            token = settings.token()
        except SettingsError as exc:
            raise SetTokenError(str(exc)) from None
        if token is None:
            raise SetTokenError(
                "no token given: pipe it in with --from - (or name a file with --from), "
                "or set RECOVERYD_TOKEN_FILE"
            )
        return Given(token)
    where = "standard input" if source == "-" else source
    try:
        raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as exc:
        raise SetTokenError(f"cannot read {where}: {exc.strerror}") from None
    return parse_given(raw, where)


def parse_given(raw: bytes, where: str) -> Given:
    """A bare token, or the credentials file's JSON; see `read_given`."""
    if raw.lstrip().startswith(b"{"):
        try:
            found = credentials_file.loads(raw, where).credentials
        except CredentialsFileError as exc:
            raise SetTokenError(str(exc)) from None
        return Given(found.token, found.password, found.username)
    try:
        token = raw.decode().strip()
    except UnicodeDecodeError:
        raise SetTokenError(f"{where} is not UTF-8 text") from None
    if not token:
        raise SetTokenError(f"{where} is empty: it must hold the token")
    if any(character.isspace() for character in token):
        raise SetTokenError(
            f"{where} holds more than one word: it must hold the token alone, or JSON "
            'as {"token": "...", "password": "..."}'
        )
    return Given(token)


async def set_token(
    settings: Settings, given: Given, *, check: bool = True, replace_unreadable: bool = False
) -> list[str]:
    """Save `given` and have a running daemon take it up; the lines to print.
    SetTokenError when it was not saved, or saved but the daemon did not take it up.
    Saved credentials that cannot be read are replaced only with `replace_unreadable`:
    a wrong key here would otherwise seal the row under a key no replica has."""
    from daemon.account.assembly import vault_for

    try:
        async with open_store(settings.STORE, release_leases=False) as store:
            vault = vault_for(settings, store)
            if vault is None:
                raise SetTokenError(
                    "nowhere to save the token: set RECOVERYD_CREDENTIALS_FILE (or, with a "
                    "PostgreSQL store, RECOVERYD_CREDENTIALS_KEY) as `recoveryd serve` has it"
                )
            if check:
                await _check_with_service(settings, given.token)
            saved = await _save(vault, given, replace_unreadable)
            if check:
                with contextlib.suppress(StoreUnavailable):
                    await store.resolve_lockout(time.time())
            shared = store.shared
    except StoreUnavailable as exc:
        raise SetTokenError(f"RECOVERYD_STORE: {exc}; the token was not saved") from None
    except SettingsError as exc:
        raise SetTokenError(str(exc)) from None
    return [f"token saved to {_where(settings)}{saved}", await _tell_daemon(settings, shared)]


async def _check_with_service(settings: Settings, token: str) -> None:
    async with service_http(10.0) as http:
        client = ServiceClient(
            http,
            base_url=settings.service_url,
            credentials=CredentialsHolder(Credentials(token)),
            header_prefix=settings.HEADER_PREFIX,
            retry=_CHECK_RETRY,
            limiter=RateLimiter(settings.MAX_RPS, pinned=settings.MAX_RPS is not None),
        )
        try:
            works = await client.token_works()
        except ServiceError as exc:
            raise SetTokenError(
                f"cannot check the token with the service ({exc}); not saved. "
                "--no-check saves it unchecked"
            ) from None
    if not works:
        raise SetTokenError("the service refuses this token; not saved")


async def _save(vault: Vault, given: Given, replace_unreadable: bool) -> str:
    """Save the token, keeping what it does not replace (the password, the username, the
    account's limits); a note for the printed line."""
    note = ""
    try:
        previous = await vault.read()
    except CredentialsFileError as exc:
        if not replace_unreadable:
            raise SetTokenError(
                f"{exc}; not saved. If the key is lost or the file broken, "
                "--replace-unreadable replaces them (their password and limits are lost)"
            ) from None
        previous, note = None, f" (the saved credentials could not be read and are replaced: {exc})"
    before = previous.credentials if previous else Credentials("")
    saved = Saved(
        Credentials(
            given.token, given.username or before.username, given.password or before.password
        ),
        limits=previous.limits if previous else {},
    )
    try:
        if not await vault.replace(saved):
            raise SetTokenError(
                "a token rotation is under way; not saved (its reset would revoke this "
                "token). Run set-token again once it has ended: GET /api/v1/status shows it"
            )
    except CredentialsFileError as exc:
        raise SetTokenError(f"{exc}; the token was not saved") from None
    return note


def _where(settings: Settings) -> str:
    if settings.CREDENTIALS_KEY is not None:
        return "the store, sealed with RECOVERYD_CREDENTIALS_KEY"
    return str(settings.CREDENTIALS_FILE)


async def _tell_daemon(settings: Settings, shared: bool) -> str:
    admin = daemon_admin(settings)
    later = (
        "every replica reads it within seconds"
        if shared
        else "it is read at the next start (a locked-out daemon reads it within 30 s)"
    )
    if admin is None:
        return f"no admin listener to ask (RECOVERYD_ADMIN_LISTEN port 0): {later}"
    try:
        answer = await ask_daemon(admin, "POST", "/-/reload-credentials", wait=30.0)
    except httpx.ConnectError:
        return f"no daemon answers at {admin}: {later}"
    except httpx.TimeoutException:
        raise SetTokenError(
            f"the token is saved, but the daemon at {admin} did not answer within 30s: {later}"
        ) from None
    except DaemonError as exc:
        raise SetTokenError(f"the token is saved, but the daemon at {admin}: {exc}") from None
    if answer.get("status") == "taken":
        return f"the daemon at {admin} took it up"
    return f"the daemon at {admin} already had this token"
