"""`recoveryd ls`: the records, newest first, as `GET /api/v1/dlq` lists them.

A running daemon (on RECOVERYD_ADMIN_LISTEN) is asked, as `recoveryd removals` does;
with none running, the store (RECOVERYD_STORE) is read here.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import httpx

from daemon.settings import Settings
from daemon.store import BadQuery, RecordQuery, StoreUnavailable

COLUMNS = ("RECEIVED", "DLQID", "STATE", "RULE", "ACTION", "STATUS", "URL GROUP / URL")


class ListError(Exception):
    """The records could not be listed; `str()` is the line to print."""


async def records_now(
    settings: Settings, wanted: dict[str, str], since: float | None, limit: int
) -> dict[str, Any]:
    """A page of records (`{"items", "next"}`) filtered by `wanted` (state, rule, action,
    q, cursor) and received within `since` seconds."""
    from daemon.admin.client import DaemonError, ask_daemon, daemon_admin
    from daemon.store import open_store

    admin = daemon_admin(settings)
    if admin is not None:
        params = {**wanted, "limit": str(limit)}
        if since is not None:
            params["since"] = f"{since}s"
        try:
            return await ask_daemon(admin, "GET", "/api/v1/dlq", params=params)
        except httpx.ConnectError:
            pass  # no daemon: read the store here
        except (httpx.TimeoutException, DaemonError) as exc:
            raise ListError(str(exc) or f"no answer from the daemon at {admin}") from None
    query = RecordQuery(**wanted, since=None if since is None else time.time() - since, limit=limit)
    try:
        async with open_store(settings.STORE, release_leases=False, create=False) as store:
            page = await store.list_records(query)
    except BadQuery as exc:
        raise ListError(f"--{exc.field}: {exc}") from None
    except StoreUnavailable as exc:
        raise ListError(f"RECOVERYD_STORE: {exc}") from None
    return {"items": page.items, "next": page.next}


def table(items: list[dict[str, Any]]) -> str:
    """The records as a table for people, one a line, columns aligned."""
    rows = [COLUMNS] + [
        (
            _iso(item["receivedAt"]),
            item["dlqId"],
            item["state"],
            item["rule"] or "-",
            item["action"] or "-",
            "-" if item["status"] is None else str(item["status"]),
            _where(item),
        )
        for item in items
    ]
    widths = [max(len(row[at]) for row in rows) for at in range(len(COLUMNS) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    )


def _where(item: dict[str, Any]) -> str:
    if item["urlGroup"] is not None:
        return f"{item['urlGroup']}/{item['endpoint'] or '-'}"
    return item["url"] or "-"


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
