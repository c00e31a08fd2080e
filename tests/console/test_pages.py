"""The console in a browser, against a daemon carrying real traffic: the pages read what
happened, the actions act on the service, and the token guards it all."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import Browser, Page, StorageState, expect

from tests.console.support import ADMIN_TOKEN, NAV, Console, runs, session_cookie, state
from tests.endpoints.support import group_endpoints, removals
from tests.support import eventually

pytestmark = [pytest.mark.needs("chromium"), pytest.mark.asyncio(loop_scope="module")]


async def test_the_overview_shows_each_section_and_links_every_page(page: Page) -> None:
    """One h1, the four sections, and the navigation's seven links."""
    await page.goto("/ui/")
    await expect(page.locator("h1")).to_have_count(1)
    for section in ("backlog", "breakers", "rules-status", "replicas"):
        await expect(page.locator(f"main section#{section}")).to_be_visible()
    nav = page.get_by_role("navigation", name="Console")
    for name in NAV:
        await expect(nav.get_by_role("link", name=name, exact=True)).to_be_visible()
    await nav.get_by_role("link", name="Failures", exact=True).click()
    await expect(page).to_have_url(re.compile(r"/ui/failures$"))


async def test_without_javascript_the_overview_is_complete_as_served(
    browser: Browser, console: Console, session: StorageState
) -> None:
    """With JavaScript off the overview's sections are filled as served."""
    context = await browser.new_context(
        base_url=console.url,
        storage_state=session,
        java_script_enabled=False,
    )
    try:
        page = await context.new_page()
        await page.goto("/ui/")
        for section in ("backlog", "breakers", "rules-status", "replicas"):
            await expect(page.locator(f"section#{section}")).not_to_be_empty()
    finally:
        await context.close()


async def test_failures_filtered_by_rule_are_those_the_rule_decided(
    page: Page, console: Console
) -> None:
    """The filter form's rule narrows the list to the dlqIds that rule decided."""
    await page.goto("/ui/failures")
    rows = page.locator("#failures tbody tr[data-dlq-id]")
    await expect(rows.first).to_be_visible()
    rule = page.locator('#filter [name="rule"]')
    if await rule.evaluate("field => field.tagName") == "SELECT":
        await rule.select_option("resume-billing")
    else:
        await rule.fill("resume-billing")
    await page.locator("#filter").get_by_role("button", name="Filter").click()

    await expect(page).to_have_url(re.compile(r"[?&]rule=resume-billing(&|$)"))
    await expect(rows).to_have_count(len(console.billing))
    shown = [await row.get_attribute("data-dlq-id") or "" for row in await rows.all()]
    assert sorted(shown) == sorted(console.billing)


async def test_the_failures_list_shows_a_new_failure_without_a_reload(
    page: Page, console: Console
) -> None:
    """console.js polls the list's fragment: a failure that comes in after the page was
    served appears in it, and the page is still the one served (a mark set on it stays)."""
    await page.goto("/ui/failures")
    await expect(page.locator("#failures tbody tr[data-dlq-id]").first).to_be_visible()
    await page.evaluate("window.servedOnce = true")
    [dlq_id] = await console.h.seed(runs("live", 1))
    await console.h.send_callbacks([dlq_id])

    await expect(page.locator(f'#failures tr[data-dlq-id="{dlq_id}"]')).to_be_visible()
    assert await page.evaluate("window.servedOnce") is True


async def test_the_rules_page_shows_what_a_reload_would_change_and_the_shadows_view(
    page: Page, console: Console
) -> None:
    """The file on disk (billing ignored) replayed above the Reload button, and the same
    file as the shadow rules, disagreeing on the billing runs; an example leads to its
    failure's page."""
    await page.goto("/ui/rules")
    for table in ("#replay-groups", "#shadow-disagreements"):
        row = page.locator(f"{table} tbody tr")
        await expect(row).to_have_count(1)
        await expect(row.locator("td").nth(0)).to_have_text("resume-billing resume")
        await expect(row.locator("td").nth(1)).to_have_text("resume-billing ignore")
        await expect(row.locator("td").nth(2)).to_have_text(str(len(console.billing)))
    section = page.locator("section#reload-would")
    await expect(section).to_contain_text("2 decisions would change")
    await section.get_by_role("link", name=console.billing[0]).click()
    await expect(page).to_have_url(re.compile(rf"/ui/failures/{re.escape(console.billing[0])}$"))


async def test_a_failure_shows_its_rule_state_and_timeline(page: Page, console: Console) -> None:
    """From the list to a dlqId's page: its rule, its state, a step per history event."""
    dlq_id = console.billing[0]
    await page.goto("/ui/failures?rule=resume-billing")
    await page.locator(f'tr[data-dlq-id="{dlq_id}"]').get_by_role("link", name=dlq_id).click()

    await expect(page).to_have_url(re.compile(rf"/ui/failures/{re.escape(dlq_id)}$"))
    await expect(page.locator("h1")).to_have_count(1)
    await expect(page.locator('#summary dd[data-field="rule"]')).to_have_text("resume-billing")
    await expect(page.locator('#summary dd[data-field="state"]')).to_have_text("done")
    # Received, decided, batched, done at least: each step of the record's history.
    history = (await console.h.record(dlq_id))["history"]
    steps = page.locator("#timeline > li")
    await expect(steps.nth(len(history) - 1)).to_be_visible()


async def test_a_removed_endpoint_is_restored_after_confirmation(
    page: Page, console: Console
) -> None:
    """Restore, then Confirm restore: the endpoint is back in its URL Group at the service."""
    await page.goto("/ui/removals")
    row = page.locator('#removals tr[data-endpoint="orders/c"]')
    await row.get_by_role("button", name="Restore").click()
    assert await group_endpoints(console.h.control, "orders") == console.members[:2]
    await page.get_by_role("button", name="Confirm restore").click()

    await eventually(
        lambda: _group_is(console, console.members), what="orders/c back in its URL Group"
    )
    [removal] = await removals(console.h.recoveryd.admin)
    assert removal["restore"]["state"] == "restored"


async def _group_is(console: Console, members: list[dict[str, str]]) -> bool:
    return await group_endpoints(console.h.control, "orders") == members


async def test_a_failed_dlq_id_is_redriven_after_confirmation_and_reaches_done(
    page: Page, console: Console
) -> None:
    """Redrive, then Confirm redrive: the dlqId refused five times is recovered."""
    dlq_id = console.failed
    await page.goto(f"/ui/failures/{dlq_id}")
    state_shown = page.locator('#summary dd[data-field="state"]')
    await expect(state_shown).to_have_text("failed")
    await page.get_by_role("button", name="Redrive").click()
    assert await state(console.h, dlq_id) == "failed"
    await page.get_by_role("button", name="Confirm redrive").click()

    async def shown_done() -> bool:
        await page.goto(f"/ui/failures/{dlq_id}")
        return await state_shown.inner_text() == "done"

    await eventually(shown_done, what=f"{dlq_id} shown done")
    history = [event["state"] for event in (await console.h.record(dlq_id))["history"]]
    assert "redriven" in history


async def test_the_token_logs_in_a_wrong_one_is_refused_and_logout_ends_the_session(
    browser: Browser, console: Console
) -> None:
    """/ui/ asks for the token (303); a wrong one is refused; Log out ends the session."""
    context = await browser.new_context(base_url=console.url)
    try:
        page = await context.new_page()
        answer = await page.goto("/ui/")
        await expect(page).to_have_url(re.compile(r"/ui/login$"))
        assert answer is not None
        assert answer.request.redirected_from is not None
        redirect = await answer.request.redirected_from.response()
        assert redirect is not None
        assert redirect.status == 303
        token = page.locator('#login input[name="token"][type="password"]')
        log_in = page.locator("#login").get_by_role("button", name="Log in")

        await token.fill("not-the-token")
        async with page.expect_response(lambda answer: answer.request.method == "POST") as posted:
            await log_in.click()
        refused = await posted.value
        assert 400 <= refused.status < 500, refused.status
        await expect(page.locator("#login")).to_be_visible()
        assert "recoveryd_session" not in [c["name"] for c in await context.cookies()]
        assert "not-the-token" not in await page.content()

        await page.locator('#login input[name="token"]').fill(ADMIN_TOKEN)
        await page.locator("#login").get_by_role("button", name="Log in").click()
        await expect(page.get_by_role("button", name="Log out")).to_be_visible()
        cookie = session_cookie(await context.storage_state())
        assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")
        assert ADMIN_TOKEN not in await page.content()
        assert ADMIN_TOKEN not in cookie["value"]

        await page.get_by_role("button", name="Log out").click()
        await page.goto("/ui/")
        await expect(page).to_have_url(re.compile(r"/ui/login"))
        await expect(page.locator("#login")).to_be_visible()
    finally:
        await context.close()
