"""What a failing delivery carries is untrusted: a callback whose fields hold script,
markup and javascript: URLs is shown as text on every page, and nothing of it runs. Every
POST needs the session's CSRF token, from a script in the page too."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.async_api import ConsoleMessage, Dialog, Page, Request, StorageState, expect

from tests.console.support import (
    IMAGE,
    JAVASCRIPT_URL,
    PAGES,
    PAYLOADS,
    SCRIPT,
    Console,
    session_cookie,
    state,
)
from tests.endpoints.support import group_endpoints

pytestmark = [pytest.mark.needs("chromium"), pytest.mark.asyncio(loop_scope="module")]


@contextmanager
def nothing_runs(page: Page) -> Iterator[list[str]]:
    """Whatever the page does that a payload could make it do: a dialog, a script error
    or CSP refusal in the console, a request for `x` or a javascript: URL. Checked empty
    at the end of the block."""
    seen: list[str] = []

    async def dialog(dialog: Dialog) -> None:
        seen.append(f"dialog: {dialog.message}")
        await dialog.dismiss()  # or the page would wait on it

    def console(message: ConsoleMessage) -> None:
        source = message.location["url"]
        if message.type == "error":
            seen.append(f"console error: {message.text} ({source})")

    def request(request: Request) -> None:
        url = urlsplit(request.url)
        if url.scheme == "javascript" or url.path.endswith("/x"):
            seen.append(f"request: {request.url}")

    page.on("dialog", dialog)
    page.on("console", console)
    page.on("pageerror", lambda error: seen.append(f"page error: {error}"))
    page.on("request", request)
    yield seen
    assert seen == []


async def assert_inert(page: Page) -> None:
    """No element a payload would have made: a script of the page's own, an image of
    `x`, an element with an event handler attribute, a javascript: link."""
    made = await page.evaluate(
        """() => [
            ...document.querySelectorAll('script:not([src]), img[src="x"], [onerror]'),
            ...[...document.querySelectorAll('[href], [src], [action]')].filter(e =>
                /^\\s*javascript:/i.test(e.getAttribute('href') || e.getAttribute('src')
                                          || e.getAttribute('action') || '')),
        ].map(e => e.outerHTML)"""
    )
    assert made == []


async def test_a_hostile_callback_is_text_on_every_page_and_nothing_of_it_runs(
    page: Page, console: Console
) -> None:
    """Script, markup and javascript: URLs in a callback's fields are shown as text only."""
    shown: dict[str, str] = {}
    pages = {**PAGES, "failure": f"/ui/failures/{console.hostile}",
             "search": f"/ui/failures?q={console.hostile}"}  # fmt: skip
    with nothing_runs(page):
        for name, path in pages.items():
            await page.goto(path)
            await expect(page.locator("main")).to_be_visible()
            await assert_inert(page)
            shown[name] = await page.locator("main").inner_text()

    # Where the failure is shown, its fields are shown as they came, as text.
    for name in ("failure", "search", "failures"):
        assert console.hostile in shown[name], name
    for payload in PAYLOADS:
        assert payload in shown["failure"], payload
    assert any(payload in shown["failures"] for payload in PAYLOADS)
    assert SCRIPT in shown["groups"]
    assert IMAGE in shown["groups"] or JAVASCRIPT_URL in shown["groups"]


async def test_no_page_logs_an_error_in_the_browsers_console(page: Page, console: Console) -> None:
    """An operator's devtools stay quiet: no page, the login form included, logs an error."""
    with nothing_runs(page):
        for path in [*PAGES.values(), f"/ui/failures/{console.billing[0]}", "/ui/login"]:
            await page.goto(path)
            await expect(page.locator("main")).to_be_visible()


async def test_every_page_is_served_with_a_strict_policy(page: Page, console: Console) -> None:
    """No inline script may run (CSP), no page may be framed, no type sniffed, no referrer
    sent: the headers of every page, the failure's own and the login form's."""
    for path in [*PAGES.values(), f"/ui/failures/{console.hostile}", "/ui/login"]:
        answer = await page.goto(path)
        assert answer is not None
        headers = await answer.all_headers()
        policy = {
            directive.split()[0]: directive.split()[1:]
            for directive in headers["content-security-policy"].split(";")
            if directive.strip()
        }
        scripts = policy.get("script-src", policy.get("default-src"))
        assert scripts, (path, policy)
        assert "'unsafe-inline'" not in scripts, (path, policy)
        assert headers["x-frame-options"] == "DENY", path
        assert headers["x-content-type-options"] == "nosniff", path
        assert headers["referrer-policy"] == "no-referrer", path


# A form as the tests read it: where it goes and its fields but the CSRF token.
FORM = """form => ({
    action: form.action,
    csrf: form.querySelectorAll('input[type=hidden][name=csrf]').length,
    fields: [...new FormData(form)].filter(([name]) => name !== 'csrf'),
})"""


async def post_forms(page: Page) -> list[dict[str, Any]]:
    """The page's POST forms."""
    forms: list[dict[str, Any]] = await page.evaluate(
        f"""() => [...document.querySelectorAll('form')]
            .filter(form => form.method === 'post').map({FORM})"""
    )
    return forms


async def form_of(page: Page, button: str) -> dict[str, Any]:
    """The form of the button named `button`."""
    form: dict[str, Any] = await page.get_by_role("button", name=button).evaluate(
        f"button => ({FORM})(button.form)"
    )
    return form


async def status_of_fetch(page: Page, form: dict[str, Any], csrf: str | None) -> int:
    """The answer's status to the form POSTed by a script of the page, with `csrf`."""
    status: int = await page.evaluate(
        """([action, fields, csrf]) => {
            const body = new URLSearchParams(fields);
            if (csrf !== null) body.append('csrf', csrf);
            return fetch(action, {method: 'POST', body, redirect: 'manual'})
                .then(answer => answer.status);
        }""",
        [form["action"], form["fields"], csrf],
    )
    return status


async def test_a_confirmed_action_without_its_csrf_token_is_refused(
    page: Page, console: Console, session: StorageState
) -> None:
    """The confirmation forms of a restore and a redrive, POSTed by a script in the page
    (same origin, session cookie sent) without the token, or with a wrong one, and by
    another client with the cookie: 403, and nothing done."""
    cookie = session_cookie(session)
    await page.goto("/ui/removals")
    await (
        page.locator('#removals tr[data-endpoint="orders/c"]')
        .get_by_role("button", name="Restore")
        .click()
    )
    confirmations = [await form_of(page, "Confirm restore")]
    await page.goto(f"/ui/failures/{console.failed}")
    await page.get_by_role("button", name="Redrive").click()
    confirmations.append(await form_of(page, "Confirm redrive"))

    assert [form["csrf"] for form in confirmations] == [1, 1], confirmations
    async with httpx.AsyncClient(cookies={"recoveryd_session": cookie.get("value", "")}) as other:
        for form in confirmations:
            assert await status_of_fetch(page, form, None) == 403, form
            assert await status_of_fetch(page, form, "not-the-token") == 403, form
            answer = await other.post(form["action"], data=dict(form["fields"]))
            assert answer.status_code == 403, form
    assert await group_endpoints(console.h.control, "orders") == console.members[:2]
    assert await state(console.h, console.failed) == "failed"


async def test_every_post_form_carries_a_csrf_token(page: Page, console: Console) -> None:
    """Every POST form of every page, Log out's too, carries the hidden csrf field."""
    pages = [*PAGES.values(), f"/ui/failures/{console.failed}"]
    forms = []
    for path in pages:
        await page.goto(path)
        forms += await post_forms(page)
    assert forms  # Restore, Redrive, Dry run, Reload rules, Log out at least
    assert [form for form in forms if form["csrf"] != 1] == []
