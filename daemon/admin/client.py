"""Commands that ask the running daemon (rotate-token, redrive, removals, restore-endpoint):
where its admin listener is, and one call to it.

Each command asks the daemon first, since the daemon holds the token, the pipeline's
workers and the store's leases; only when nothing listens there does it do the work in
its own process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from daemon.settings import Settings


class DaemonError(Exception):
    """The daemon did not answer, or answered with an error; `str()` is the line to print."""


@dataclass(frozen=True)
class Admin:
    """The running daemon's admin listener, as a command reaches it: its URL, and the
    bearer token it requires (RECOVERYD_ADMIN_TOKEN), if any. Shown as its URL."""

    url: str
    token: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        return self.url


def daemon_admin(settings: Settings) -> Admin | None:
    """Where a daemon with these settings listens for admin calls, seen from here."""
    host, port = settings.admin_listen
    if port == 0:
        return None
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    token = settings.ADMIN_TOKEN
    return Admin(url, None if token is None else token.get_secret_value())


async def ask_daemon(
    admin: Admin,
    method: str,
    path: str,
    *,
    wait: float = 60.0,
    json: Any = None,
    params: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The daemon's answer to one call, when it is 200 and a JSON object.

    `httpx.ConnectError` when nothing listens (the caller then does the work itself),
    `httpx.TimeoutException` when the daemon took longer than `wait` seconds, and DaemonError
    with the daemon's own `error` for any other answer or failure."""
    headers = {} if admin.token is None else {"Authorization": f"Bearer {admin.token}"}
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(wait, connect=2.0)) as http:
            response = await http.request(
                method, f"{admin.url}{path}", json=json, params=params, headers=headers
            )
    except (httpx.ConnectError, httpx.TimeoutException):
        raise
    except httpx.HTTPError as exc:
        raise DaemonError(f"the daemon at {admin} did not answer: {exc!r}") from None
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if response.status_code == 200 and isinstance(answer, dict):
        return answer
    error = answer.get("error") if isinstance(answer, dict) else None
    raise DaemonError(str(error or f"the daemon at {admin} answered {response.status_code}"))
