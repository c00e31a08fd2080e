"""The console's guards: the admin token's login and session, CSRF on every POST, and
the security headers on every /ui response."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from daemon.admin.console.security import CSRF_COOKIE, SESSION_COOKIE
from tests.admin.console.support import console, csrf_of

ADMIN_TOKEN = "adm_c0nsole-Token"
POSTS = [
    ("/ui/redrive", {"dlqId": "1-0"}),
    ("/ui/restore", {"group": "g", "name": "n"}),
    ("/ui/sweeps/dry-run", {"sweep": "nightly"}),
    ("/ui/reload", {}),
    ("/ui/logout", {}),
    ("/ui/login", {"token": "x"}),
]


@pytest.mark.parametrize(("path", "fields"), POSTS)
async def test_a_post_without_the_csrf_token_is_403(
    tmp_path: Path, path: str, fields: dict[str, str]
) -> None:
    """No CSRF field (a cross-site form would have none): 403, nothing done."""
    async with console(tmp_path) as c:
        await c.ui.get("/ui/")  # the CSRF cookie set
        response = await c.ui.post(path, data=fields)
    assert response.status_code == 403


@pytest.mark.parametrize(("path", "fields"), POSTS)
async def test_a_post_with_a_wrong_csrf_token_is_403(
    tmp_path: Path, path: str, fields: dict[str, str]
) -> None:
    async with console(tmp_path) as c:
        await c.ui.get("/ui/")
        response = await c.ui.post(path, data={"csrf": "not-the-cookies", **fields})
    assert response.status_code == 403


async def test_a_reload_without_the_csrf_token_does_not_reload(tmp_path: Path) -> None:
    """The refused POST changes nothing: the rules stay the object in force."""
    async with console(tmp_path) as c:
        before = c.daemon.daemon.rules.current
        await c.ui.get("/ui/")
        await c.ui.post("/ui/reload", data={})
        assert c.daemon.daemon.rules.current is before


async def test_with_a_token_a_page_without_a_session_redirects_to_the_login(
    tmp_path: Path,
) -> None:
    async with console(tmp_path, ADMIN_TOKEN=ADMIN_TOKEN) as c:
        response = await c.ui.get("/ui/failures")
        login = await c.ui.get("/ui/login")
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/login"
    assert login.status_code == 200
    assert '<form id="login"' in login.text
    assert 'name="token" type="password"' in login.text


async def test_logging_in_opens_the_console_and_logging_out_closes_it(tmp_path: Path) -> None:
    """The token once, then the session cookie; after Log out, the login again."""
    async with console(tmp_path, ADMIN_TOKEN=ADMIN_TOKEN) as c:
        logged_in = await c.post_form("/ui/login", "/ui/login", token=ADMIN_TOKEN)
        overview = await c.ui.get("/ui/")
        logged_out = await c.ui.post("/ui/logout", data={"csrf": csrf_of(overview.text)})
        after = await c.ui.get("/ui/")
    assert logged_in.status_code == 303
    assert logged_in.headers["location"] == "/ui/"
    assert overview.status_code == 200
    assert ">Log out</button>" in overview.text
    assert ADMIN_TOKEN not in overview.text
    assert logged_out.status_code == 303
    assert after.status_code == 303
    assert after.headers["location"] == "/ui/login"


async def test_the_session_cookie_is_httponly_strict_and_holds_no_token(tmp_path: Path) -> None:
    async with console(tmp_path, ADMIN_TOKEN=ADMIN_TOKEN) as c:
        response = await c.post_form("/ui/login", "/ui/login", token=ADMIN_TOKEN)
    cookie = next(
        value
        for name, value in response.headers.multi_items()
        if name == "set-cookie" and value.startswith(f"{SESSION_COOKIE}=")
    )
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert ADMIN_TOKEN not in cookie


async def test_a_wrong_token_is_refused_and_not_logged(tmp_path: Path) -> None:
    """401 with the form again; neither the token tried nor the admin token in the log."""
    async with console(tmp_path, ADMIN_TOKEN=ADMIN_TOKEN) as c:
        with capture_logs() as logs:
            response = await c.post_form("/ui/login", "/ui/login", token="adm_guess")
        after = await c.ui.get("/ui/")
    assert response.status_code == 401
    assert "That is not the admin token." in response.text
    assert after.status_code == 303
    assert "adm_guess" not in repr(logs)
    assert ADMIN_TOKEN not in repr(logs)


async def test_a_forged_session_cookie_is_not_a_session(tmp_path: Path) -> None:
    async with console(tmp_path, ADMIN_TOKEN=ADMIN_TOKEN) as c:
        c.ui.cookies.set(SESSION_COOKIE, "9999999999.00", path="/ui")
        response = await c.ui.get("/ui/")
    assert response.status_code == 303


async def test_the_bearer_token_still_opens_the_admin_api_and_not_without(tmp_path: Path) -> None:
    """A session cookie is the console's: the API still wants the bearer token."""
    async with console(tmp_path, ADMIN_TOKEN=ADMIN_TOKEN) as c:
        await c.post_form("/ui/login", "/ui/login", token=ADMIN_TOKEN)
        api = await c.ui.get("/api/v1/status")
    assert api.status_code == 401


@pytest.mark.parametrize(
    "path", ["/ui/", "/ui/failures", "/ui/login", "/ui/static/console.css", "/ui/nowhere"]
)
async def test_every_console_response_has_the_security_headers(tmp_path: Path, path: str) -> None:
    """CSP without inline script, no framing, no sniffing, no referrer; also on the
    redirect to the login."""
    async with console(tmp_path, ADMIN_TOKEN=ADMIN_TOKEN) as c:
        response = await c.ui.get(path)
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"


async def test_pages_are_never_cached_and_static_files_may_be(tmp_path: Path) -> None:
    async with console(tmp_path) as c:
        page = await c.ui.get("/ui/rules")
        css = await c.ui.get("/ui/static/console.css")
    assert page.headers["cache-control"] == "no-store"
    assert "no-store" not in css.headers.get("cache-control", "")
    assert "etag" in css.headers


async def test_the_csrf_cookie_is_httponly_and_strict(tmp_path: Path) -> None:
    async with console(tmp_path) as c:
        response = await c.ui.get("/ui/sweeps")
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{CSRF_COOKIE}=")
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
