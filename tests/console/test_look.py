"""Every page, light and dark: a screenshot saved for people to look at (CI keeps them),
and axe-core's audit, which finds no serious or critical violation."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from axe_playwright_python.async_playwright import Axe  # type: ignore[import-untyped]
from playwright.async_api import Browser, Page, StorageState, expect

from tests.console.support import PAGES, SCREENSHOTS, Console, dumps

pytestmark = [pytest.mark.needs("chromium"), pytest.mark.asyncio(loop_scope="module")]

SEVERE = ("serious", "critical")


async def look(page: Page, name: str, theme: str) -> list[dict[str, Any]]:
    """Save the page's screenshot; axe's serious and critical violations on it."""
    await expect(page.locator("main")).to_be_visible()
    await page.screenshot(path=SCREENSHOTS / f"{name}-{theme}.png", full_page=True)
    results = await Axe().run(page)
    violations: list[dict[str, Any]] = results.response["violations"]
    return [{"page": name, **v} for v in violations if v["impact"] in SEVERE]


@pytest.mark.parametrize("theme", ["light", "dark"])
async def test_every_page_has_no_serious_accessibility_violation(
    browser: Browser,
    console: Console,
    session: StorageState,
    theme: Literal["light", "dark"],
) -> None:
    """Each page and confirmation, in `theme`: screenshot saved, axe finds nothing serious."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    found = []
    context = await browser.new_context(
        base_url=console.url, color_scheme=theme, viewport={"width": 1280, "height": 800}
    )
    try:
        page = await context.new_page()
        await page.goto("/ui/login")
        found += await look(page, "login", theme)
        await context.add_cookies(list(session.get("cookies", [])))  # type: ignore[arg-type]
        for name, path in PAGES.items():
            await page.goto(path)
            found += await look(page, name, theme)
        await page.goto(f"/ui/failures/{console.billing[0]}")
        found += await look(page, "failure", theme)
        # The confirmations, which act only once confirmed.
        await page.goto(f"/ui/failures/{console.failed}")
        await page.get_by_role("button", name="Redrive").click()
        found += await look(page, "redrive-confirmation", theme)
        await page.goto("/ui/removals")
        await page.get_by_role("button", name="Restore").first.click()
        found += await look(page, "restore-confirmation", theme)
        await page.goto("/ui/rules")
        await page.get_by_role("button", name="Reload rules").click()
        found += await look(page, "reload-confirmation", theme)
        await page.goto("/ui/sweeps")
        await page.get_by_role("button", name="Dry run").first.click()
        found += await look(page, "sweep-dry-run", theme)
    finally:
        await context.close()
    assert found == [], dumps(found)
