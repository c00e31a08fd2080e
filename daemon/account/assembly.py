"""The account put together from the settings: the vault of rotated credentials, the
credentials to start with, and the service client and the token rotation sharing them.

The daemon (daemon.app) builds its account here, and so do the commands that call the
service when no daemon answers (`recoveryd rotate-token`, `restore-endpoint`, a sweep's
dry run, `set-token`'s vault), without the rest of the daemon.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
import structlog
from prometheus_client import CollectorRegistry

from daemon.account import CredentialsFileError, RotationTiming, Rotator, Saved
from daemon.account import credentials_file as credentials_files
from daemon.account.rotation import missing_basic_credentials
from daemon.account.vault import CredentialsStore, FileVault, StoreVault, Vault
from daemon.metrics import Metrics
from daemon.pipeline.calls import observer
from daemon.runtime.supervisor import Supervisor
from daemon.settings import PREFIX, Settings, SettingsError
from daemon.store import Store, open_store
from daemon.upstream import (
    BreakerPolicy,
    Credentials,
    CredentialsHolder,
    RateLimiter,
    RetryPolicy,
    ServiceClient,
    service_http,
)

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Alone:
    """The account without the rest of the daemon: its store, client, rotator, metrics."""

    store: Store
    client: ServiceClient
    rotator: Rotator
    metrics: Metrics


@contextlib.asynccontextmanager
async def account_alone(
    settings: Settings, *, create: bool = True, http_timeout: float = 30.0
) -> AsyncIterator[Alone]:
    """The account as a command builds it when no daemon is running: the store (its
    leases left alone; with `create` false, one serve never made is StoreMissing) and
    the service client, with the credentials in force."""
    metrics = Metrics(CollectorRegistry())
    async with (
        open_store(settings.STORE, release_leases=False, create=create) as store,
        service_http(http_timeout) as http,
    ):
        vault = vault_for(settings, store)
        credentials, saved = await initial_credentials(settings, vault)
        client, rotator = account(settings, http, store, metrics, vault, credentials, saved)
        yield Alone(store, client, rotator, metrics)


@contextlib.asynccontextmanager
async def rotating_alone(
    settings: Settings, *, http_timeout: float = 30.0
) -> AsyncIterator[Rotator]:
    """A rotator without the rest of the daemon, for `recoveryd rotate-token` when no
    daemon is running."""
    async with account_alone(settings, http_timeout=http_timeout) as alone:
        yield alone.rotator


def vault_for(settings: Settings, store: Store | None) -> Vault | None:
    """Where rotated credentials are kept: the store with RECOVERYD_CREDENTIALS_KEY, the
    credentials file with RECOVERYD_CREDENTIALS_FILE, else nowhere (no rotation)."""
    if settings.CREDENTIALS_KEY is not None:
        if not isinstance(store, CredentialsStore):
            raise SettingsError(f"{PREFIX}CREDENTIALS_KEY: needs a PostgreSQL store")
        return StoreVault(store, settings.CREDENTIALS_KEY.get_secret_value())
    if settings.CREDENTIALS_FILE is not None:
        return FileVault(settings.CREDENTIALS_FILE, store)
    return None


async def initial_credentials(
    settings: Settings, vault: Vault | None
) -> tuple[Credentials, Saved | None]:
    """The credentials to start with: the saved ones, when there are, over the
    environment's (a rotation has made those stale). SettingsError if they are bad."""
    password = settings.ACCOUNT_PASSWORD.get_secret_value() if settings.ACCOUNT_PASSWORD else None
    from_environment = Credentials(settings.token() or "", settings.ACCOUNT_USERNAME, password)
    if vault is None:
        vault = vault_for(settings, None) if settings.CREDENTIALS_KEY is None else None
    if vault is None:
        return from_environment, None
    setting = "CREDENTIALS_KEY" if vault.shared else "CREDENTIALS_FILE"
    try:
        saved = await vault.read()
    except CredentialsFileError as exc:
        raise SettingsError(f"{PREFIX}{setting}: {exc}") from None
    if saved is None:
        return from_environment, None
    if isinstance(vault, FileVault) and credentials_files.readable_by_others(vault.path):
        log.warning("the credentials file can be read by others; make it mode 0600",
                    path=str(vault.path))  # fmt: skip
    return credentials_files.merged(saved.credentials, from_environment), saved


async def credentials_in_use(settings: Settings) -> Credentials:
    """The credentials a command calls the service with, as `serve` would start with them:
    the saved ones first, from the store (opened for the read) with
    RECOVERYD_CREDENTIALS_KEY, where rotations and `recoveryd set-token` leave them."""
    if settings.CREDENTIALS_KEY is None:
        return (await initial_credentials(settings, None))[0]
    async with open_store(settings.STORE, release_leases=False, create=False) as store:
        return (await initial_credentials(settings, vault_for(settings, store)))[0]


def check_rotation(settings: Settings, credentials: Credentials) -> None:
    """SettingsError when a rotation is scheduled that could not be made."""
    missing = missing_basic_credentials(credentials)
    if settings.ROTATE_SCHEDULE and missing:
        raise SettingsError(f"{PREFIX}ROTATE_SCHEDULE: {missing}")


def account(
    settings: Settings,
    http: httpx.AsyncClient,
    store: Store,
    metrics: Metrics,
    vault: Vault | None,
    credentials: Credentials,
    saved: Saved | None,
    retry: RetryPolicy | None = None,
    timing: RotationTiming | None = None,
    wall_clock: Callable[[], float] = time.time,
    supervisor: Supervisor | None = None,
    breaker: BreakerPolicy | None = None,
) -> tuple[ServiceClient, Rotator]:
    """The service client and the token rotation, sharing the credentials they hold."""
    holder = CredentialsHolder(credentials)
    client = ServiceClient(
        http,
        base_url=settings.service_url,
        account_url=settings.account_url,
        credentials=holder,
        header_prefix=settings.HEADER_PREFIX,
        retry=retry,
        observe=observer(metrics, wall_clock),
        limiter=RateLimiter(settings.MAX_RPS, pinned=settings.MAX_RPS is not None, probe=True),
        breaker=breaker,
    )
    rotator = Rotator(
        client,
        holder,
        store,
        metrics,
        vault=vault,
        schedule=settings.ROTATE_SCHEDULE,
        timing=timing,
        supervisor=supervisor,
        wall_clock=wall_clock,
    )
    if saved is not None:
        rotator.adopt(saved.limits)
    return client, rotator
