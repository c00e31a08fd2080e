"""Fixtures of the console's tests: per module, one console on a daemon started once
(`console` in support.py), for the tests that only read it; per test, a client of its own
(a browser with no cookie yet). A module that uses them shares its event loop
(`pytestmark = pytest.mark.asyncio(loop_scope="module")`): the daemon lives in it."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from tests.admin.console.support import ADMIN_TOKEN, Console, console
from tests.support import LOOPBACK_TLS


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def open_console_daemon(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Console]:
    """The console with no admin token, started once for the module."""
    async with console(tmp_path_factory.mktemp("console")) as started:
        yield started


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def guarded_console_daemon(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Console]:
    """The console behind RECOVERYD_ADMIN_TOKEN, started once for the module."""
    async with console(tmp_path_factory.mktemp("console"), ADMIN_TOKEN=ADMIN_TOKEN) as started:
        yield started


@pytest_asyncio.fixture(loop_scope="module")
async def open_console(open_console_daemon: Console) -> AsyncIterator[Console]:
    """The module's console without a token, as a new browser sees it."""
    async with own_client(open_console_daemon) as seen:
        yield seen


@pytest_asyncio.fixture(loop_scope="module")
async def guarded_console(guarded_console_daemon: Console) -> AsyncIterator[Console]:
    """The module's console behind the admin token, as a new browser sees it: no session."""
    async with own_client(guarded_console_daemon) as seen:
        yield seen


@contextlib.asynccontextmanager
async def own_client(shared: Console) -> AsyncIterator[Console]:
    """`shared` through a client of its own: its cookies (session, CSRF) are this test's."""
    admin = shared.daemon.admin
    async with httpx.AsyncClient(
        base_url=admin.base_url, timeout=admin.timeout, verify=LOOPBACK_TLS
    ) as client:
        yield dataclasses.replace(shared, daemon=dataclasses.replace(shared.daemon, admin=client))
