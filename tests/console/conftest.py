"""Fixtures of the console's browser tests: per module, one daemon and emulator seeded
with traffic (tests.console.support.seed), one Chromium, and a session logged in once;
per test, a fresh browser context. A module's tests share its event loop
(`pytestmark = pytest.mark.asyncio(loop_scope="module")`): the daemon and the browser
live in it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, StorageState, async_playwright, expect

from tests import system_tools
from tests.console.support import ADMIN_TOKEN, CANDIDATE, RULES, Console, seed
from tests.pipeline.support import harness

# A loaded CI machine runs two suites of two workers: give a page more than 5 s to show.
expect.set_options(timeout=20_000)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def console(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Console]:
    """recoveryd with RECOVERYD_ADMIN_TOKEN set, the emulator, and the seeded failures;
    CANDIDATE as its shadow rules, and on disk in place of its rules once seeded."""
    tmp_path: Path = tmp_path_factory.mktemp("console")
    shadow = tmp_path / "shadow.yaml"
    shadow.write_text(CANDIDATE)
    async with harness(tmp_path, RULES, ADMIN_TOKEN=ADMIN_TOKEN, SHADOW_RULES=str(shadow)) as h:
        h.recoveryd.admin.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
        seeded = await seed(h)
        (tmp_path / "rules.yaml").write_text(CANDIDATE)  # the Rules page's replay of it
        yield seeded


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    """Debian's Chromium, headless: Playwright drives it rather than one it downloads."""
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=system_tools.path("chromium"))
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def session(browser: Browser, console: Console) -> StorageState:
    """A context's storage state once logged in with the admin token: the session cookie."""
    context = await browser.new_context(base_url=console.url)
    try:
        page = await context.new_page()
        await page.goto("/ui/login")
        await page.locator('#login input[name="token"]').fill(ADMIN_TOKEN)
        await page.get_by_role("button", name="Log in").click()
        await expect(page.get_by_role("button", name="Log out")).to_be_visible()
        return await context.storage_state()
    finally:
        await context.close()


@pytest_asyncio.fixture(loop_scope="module")
async def page(browser: Browser, console: Console, session: StorageState) -> AsyncIterator[Page]:
    """A page in a fresh context, logged in, on the console's origin."""
    context = await browser.new_context(base_url=console.url, storage_state=session)
    try:
        yield await context.new_page()
    finally:
        await context.close()
