"""Removals listed and undone: `recoveryd removals`, `recoveryd restore-endpoint`, and the
admin routes behind them (api.py).

A removed endpoint is put back from its record, with the name and url read from the
group before it was removed, by QStash's add endpoints (which creates the group again
if its last endpoint went). The restore is recorded as under way before the call and
settled after; adding an endpoint the group already has changes nothing, so a restore
cut short is simply run again. As `recoveryd redrive` does, the commands ask a running
daemon first and work on the store (and call the service) themselves only when none
answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
import structlog

from daemon.metrics import Metrics
from daemon.pipeline.calls import recording
from daemon.settings import Settings
from daemon.store import Store, StoreUnavailable
from daemon.store.removals import RestoreRefused, shown
from daemon.upstream import EndpointRef, ServiceClient, ServiceError

log = structlog.get_logger(__name__)


class RemovalsError(Exception):
    """The command did not do what was asked; `str()` is the one line to print."""


class RestoreFailed(Exception):
    """The service did not take the endpoint back; the removal can be restored again."""


async def restore(
    store: Store,
    client: ServiceClient,
    metrics: Metrics,
    group: str,
    name: str,
    wall_clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Put back the endpoint `name` (its name, or its url when it has none) of `group` as
    its last removal recorded it; the answer of the admin route. RestoreRefused when
    there is nothing to restore, RestoreFailed when the service did not take it."""
    removal = await store.begin_restore(group, name, wall_clock())
    endpoint = EndpointRef(name=removal.name, url=removal.url)
    what = f"endpoint {shown(removal.name, removal.url)} of URL Group {group}"
    with recording() as calls:
        try:
            await client.add_endpoints(group, [endpoint])
        except ServiceError as exc:
            reason = f"restoring {what} failed: {exc}"
            await store.finish_restore(
                removal.id, restored=False, reason=reason, calls=list(calls), now=wall_clock()
            )
            metrics.endpoint_restores["failed"].inc()
            raise RestoreFailed(reason) from None
    await store.finish_restore(
        removal.id, restored=True, reason=f"restored {what}", calls=list(calls), now=wall_clock()
    )
    metrics.endpoint_restores["restored"].inc()
    return {
        "status": "restored",
        "removal": removal.id,
        "urlGroup": group,
        "endpoint": endpoint.wire(),
    }


async def removals_now(settings: Settings, group: str | None) -> list[dict[str, Any]]:
    """The removals, from the daemon on RECOVERYD_ADMIN_LISTEN, else from the store."""
    from daemon.admin.client import DaemonError, ask_daemon, daemon_admin
    from daemon.store import open_store

    admin = daemon_admin(settings)
    if admin is not None:
        params = {"group": group} if group is not None else {}
        try:
            answer = await ask_daemon(admin, "GET", "/api/v1/removals", params=params)
        except httpx.ConnectError:
            pass  # no daemon: read the store here
        except (httpx.TimeoutException, DaemonError) as exc:
            raise RemovalsError(str(exc) or f"no answer from the daemon at {admin}") from None
        else:
            found: list[dict[str, Any]] = answer["removals"]
            return found
    try:
        async with open_store(settings.STORE, release_leases=False, create=False) as store:
            return await store.removals(group)
    except StoreUnavailable as exc:
        raise RemovalsError(f"RECOVERYD_STORE: {exc}") from None


async def restore_told(
    store: Store,
    client: ServiceClient,
    metrics: Metrics,
    group: str,
    name: str,
    wall_clock: Callable[[], float] = time.time,
    via: str | None = None,
) -> dict[str, Any]:
    """`restore` for a running daemon (the admin API, the console): carried on if the
    caller hangs up, and logged once done (the audit; `via` says who asked)."""
    answer = await asyncio.shield(restore(store, client, metrics, group, name, wall_clock))
    log.info("endpoint restored", url_group=group, removal=answer["removal"],
             **({"via": via} if via else {}))  # fmt: skip
    return answer


async def restore_now(settings: Settings, group: str, name: str) -> dict[str, Any]:
    """Restore through the daemon on RECOVERYD_ADMIN_LISTEN, else here."""
    from daemon.admin.client import DaemonError, ask_daemon, daemon_admin

    admin = daemon_admin(settings)
    if admin is not None:
        path = f"/api/v1/removals/{quote(group, safe='')}/{quote(name, safe='')}/restore"
        try:
            return await ask_daemon(admin, "POST", path)
        except httpx.ConnectError:
            pass  # no daemon: restore here
        except (httpx.TimeoutException, DaemonError) as exc:
            raise RemovalsError(str(exc) or f"no answer from the daemon at {admin}") from None
    return await _restore_here(settings, group, name)


async def _restore_here(settings: Settings, group: str, name: str) -> dict[str, Any]:
    from daemon.account.assembly import account_alone
    from daemon.settings import SettingsError

    try:
        async with account_alone(settings, create=False) as alone:
            return await restore(alone.store, alone.client, alone.metrics, group, name)
    except (RestoreRefused, RestoreFailed, SettingsError) as exc:
        raise RemovalsError(str(exc)) from None
    except StoreUnavailable as exc:
        raise RemovalsError(f"RECOVERYD_STORE: {exc}") from None
