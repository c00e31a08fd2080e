"""The console's guards: the admin token's login and session, CSRF on every POST, and
the security headers on every /ui response."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from daemon.admin.console.security import CSRF_COOKIE, SESSION_COOKIE
from tests.admin.console.support import ADMIN_TOKEN, Console, csrf_of

# Each test reads one of two consoles started once for the module (conftest.py): one
# without a token, one behind it; each test is a new browser (a client of its own).
pytestmark = pytest.mark.asyncio(loop_scope="module")

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
    open_console: Console, path: str, fields: dict[str, str]
) -> None:
    """No CSRF field (a cross-site form would have none): 403, nothing done."""
    await open_console.ui.get("/ui/")  # the CSRF cookie set
    response = await open_console.ui.post(path, data=fields)
    assert response.status_code == 403


@pytest.mark.parametrize(("path", "fields"), POSTS)
async def test_a_post_with_a_wrong_csrf_token_is_403(
    open_console: Console, path: str, fields: dict[str, str]
) -> None:
    await open_console.ui.get("/ui/")
    response = await open_console.ui.post(path, data={"csrf": "not-the-cookies", **fields})
    assert response.status_code == 403


async def test_a_reload_without_the_csrf_token_does_not_reload(open_console: Console) -> None:
    """The refused POST changes nothing: the rules stay the object in force."""
    before = open_console.daemon.daemon.rules.current
    await open_console.ui.get("/ui/")
    await open_console.ui.post("/ui/reload", data={})
    assert open_console.daemon.daemon.rules.current is before


async def test_with_a_token_a_page_without_a_session_redirects_to_the_login(
    guarded_console: Console,
) -> None:
    response = await guarded_console.ui.get("/ui/failures")
    login = await guarded_console.ui.get("/ui/login")
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/login"
    assert login.status_code == 200
    assert '<form id="login"' in login.text
    assert 'name="token" type="password"' in login.text


async def test_logging_in_opens_the_console_and_logging_out_closes_it(
    guarded_console: Console,
) -> None:
    """The token once, then the session cookie; after Log out, the login again."""
    logged_in = await guarded_console.post_form("/ui/login", "/ui/login", token=ADMIN_TOKEN)
    overview = await guarded_console.ui.get("/ui/")
    logged_out = await guarded_console.ui.post("/ui/logout", data={"csrf": csrf_of(overview.text)})
    after = await guarded_console.ui.get("/ui/")
    assert logged_in.status_code == 303
    assert logged_in.headers["location"] == "/ui/"
    assert overview.status_code == 200
    assert ">Log out</button>" in overview.text
    assert ADMIN_TOKEN not in overview.text
    assert logged_out.status_code == 303
    assert after.status_code == 303
    assert after.headers["location"] == "/ui/login"


async def test_the_session_cookie_is_httponly_strict_and_holds_no_token(
    guarded_console: Console,
) -> None:
    response = await guarded_console.post_form("/ui/login", "/ui/login", token=ADMIN_TOKEN)
    cookie = next(
        value
        for name, value in response.headers.multi_items()
        if name == "set-cookie" and value.startswith(f"{SESSION_COOKIE}=")
    )
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert ADMIN_TOKEN not in cookie


async def test_a_wrong_token_is_refused_and_not_logged(guarded_console: Console) -> None:
    """401 with the form again; neither the token tried nor the admin token in the log."""
    with capture_logs() as logs:
        response = await guarded_console.post_form("/ui/login", "/ui/login", token="adm_guess")
    after = await guarded_console.ui.get("/ui/")
    assert response.status_code == 401
    assert "That is not the admin token." in response.text
    assert after.status_code == 303
    assert "adm_guess" not in repr(logs)
    assert ADMIN_TOKEN not in repr(logs)


async def test_a_forged_session_cookie_is_not_a_session(guarded_console: Console) -> None:
    guarded_console.ui.cookies.set(SESSION_COOKIE, "9999999999.00", path="/ui")
    response = await guarded_console.ui.get("/ui/")
    assert response.status_code == 303


async def test_the_bearer_token_still_opens_the_admin_api_and_not_without(
    guarded_console: Console,
) -> None:
    """A session cookie is the console's: the API still wants the bearer token."""
    await guarded_console.post_form("/ui/login", "/ui/login", token=ADMIN_TOKEN)
    api = await guarded_console.ui.get("/api/v1/status")
    assert api.status_code == 401


@pytest.mark.parametrize(
    "path", ["/ui/", "/ui/failures", "/ui/login", "/ui/static/console.css", "/ui/nowhere"]
)
async def test_every_console_response_has_the_security_headers(
    guarded_console: Console, path: str
) -> None:
    """CSP without inline script, no framing, no sniffing, no referrer; also on the
    redirect to the login."""
    response = await guarded_console.ui.get(path)
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"


async def test_pages_are_never_cached_and_static_files_may_be(open_console: Console) -> None:
    page = await open_console.ui.get("/ui/rules")
    css = await open_console.ui.get("/ui/static/console.css")
    assert page.headers["cache-control"] == "no-store"
    assert "no-store" not in css.headers.get("cache-control", "")
    assert "etag" in css.headers


async def test_the_csrf_cookie_is_httponly_and_strict(open_console: Console) -> None:
    response = await open_console.ui.get("/ui/sweeps")
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{CSRF_COOKIE}=")
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
