"""`recoveryd serve`: check the settings, open the listeners, run until SIGTERM."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

import structlog
import uvicorn

from daemon.app import running
from daemon.foundation.logs import configure_logging
from daemon.http.serving import bind, serve_until_stopped
from daemon.http.uvicorn_version import unsupported
from daemon.rules import FileError, Unreadable
from daemon.runtime.descriptors import raise_soft_limit
from daemon.settings import PREFIX, Settings, SettingsError, load_settings
from daemon.store import StoreUnavailable

log = structlog.get_logger(__name__)


class StartError(Exception):
    """The daemon cannot start; `str()` is what to print, a line a problem."""


def serve(environ: Mapping[str, str] = os.environ, *, rules: Path | None = None) -> None:
    """Run the daemon in the foreground; StartError when a setting or a listener is bad, or
    the installed uvicorn is not one the listener is tested against."""
    problem = unsupported(uvicorn.__version__)
    if problem:
        raise StartError(problem)
    try:
        overrides: dict[str, Any] = {"RULES": rules} if rules is not None else {}
        # Required by serve, unlike dev (which runs its own emulator).
        settings = load_settings(environ, require=("SERVICE_URL",), **overrides)
    except SettingsError as exc:
        raise StartError(str(exc)) from None
    configure_logging(settings.LOG_FORMAT)
    if settings.ALLOW_UNSIGNED:
        log.warning(
            "unsigned callbacks are accepted (RECOVERYD_ALLOW_UNSIGNED=true): anyone who can "
            "reach the public listener can make recoveryd act"
        )
    before, after = raise_soft_limit()
    if after > before:
        log.info("descriptor limit raised to the hard limit", was=before, now=after)
    listeners = [_bind("LISTEN", *settings.listen), _bind("ADMIN_LISTEN", *settings.admin_listen)]
    _run(_serve(settings, listeners))


async def _serve(settings: Settings, sockets: list[socket.socket]) -> None:
    try:
        async with running(settings) as daemon:
            log.info(
                "recoveryd serving",
                listen=settings.LISTEN,
                admin_listen=settings.ADMIN_LISTEN,
                store=settings.STORE,
                rules=str(settings.RULES),
                rules_sha256=daemon.rules.current.digest,
            )
            reloads: set[asyncio.Task[Any]] = set()

            def reload() -> None:
                # The outcome is logged by the reload itself; a refused file changes nothing.
                task = asyncio.create_task(daemon.rules.reload())
                reloads.add(task)
                task.add_done_callback(_settled(reloads))

            listeners = [
                (daemon.public, sockets[0], daemon.public_http),
                (daemon.admin, sockets[1], daemon.admin_http),
            ]
            await serve_until_stopped(listeners, on_hangup=reload)
    except StoreUnavailable as exc:
        raise StartError(f"{PREFIX}STORE: {exc}") from None
    except FileError as exc:
        raise StartError(f"{PREFIX}RULES: the rules file has problems:\n{exc}") from None
    except Unreadable as exc:
        raise StartError(f"{PREFIX}RULES: {exc}") from None
    except SettingsError as exc:
        raise StartError(str(exc)) from None
    log.info("recoveryd stopped")


def _settled(tasks: set[asyncio.Task[Any]]) -> Any:
    def forget(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the reload has logged it already

    return forget


def _bind(setting: str, host: str, port: int) -> socket.socket:
    try:
        return bind(host, port)
    except OSError as exc:
        message = f"cannot listen on {host}:{port}: {exc.strerror}"
        raise StartError(f"{PREFIX}{setting}: {message}") from None


def _run(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:  # uvicorn[standard] brings it on Linux and macOS, not on Windows
        asyncio.run(main)
    else:
        uvloop.run(main)
