"""The console's guards: the session cookie, the CSRF token and the security headers.

The session is a signed issue time, under a key derived from RECOVERYD_ADMIN_TOKEN: no
state to keep, and a new token ends every session. The CSRF token is double-submitted
(a cookie and the form's hidden field must match): the cookie is SameSite=Strict, and a
page of another site can neither read it nor set the field, also on a console with no
admin token on loopback. Every comparison takes as long whatever the mismatch.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SESSION_COOKIE = "recoveryd_session"
CSRF_COOKIE = "recoveryd_csrf"
SESSION_SECONDS = 12 * 3600  # an operator's shift; then the token is asked again

# No inline script or style at all: what the console runs and shows ships in the wheel.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# Pages show the store's values and carry the CSRF token: never kept by a cache. The
# static files are the same for a release, and revalidated by their ETag.
NO_STORE = {"Cache-Control": "no-store"}


def session_key(token: str) -> bytes:
    """The key sessions are signed with, derived from the admin token (never the token)."""
    return hmac.new(token.encode(), b"recoveryd console session", hashlib.sha256).digest()


def new_session(key: bytes, now: float) -> str:
    issued = str(int(now))
    return f"{issued}.{_mac(key, issued)}"


def valid_session(key: bytes, value: str | None, now: float) -> bool:
    """Whether `value` is a session this key signed, issued within SESSION_SECONDS."""
    issued, _, mac = (value or "").partition(".")
    if not issued.isascii() or not issued.isdigit():
        return False
    signed = hmac.compare_digest(mac.encode(), _mac(key, issued).encode())
    return signed and 0 <= now - int(issued) < SESSION_SECONDS


def same_token(given: str, token: str) -> bool:
    """The login's check, in constant time (over digests: the lengths may differ)."""
    digest = hashlib.sha256
    return hmac.compare_digest(digest(given.encode()).digest(), digest(token.encode()).digest())


def new_csrf() -> str:
    return secrets.token_urlsafe(32)


def csrf_holds(cookie: str | None, field: str | None) -> bool:
    """The double submit: the form's field is the cookie's value, and there is one."""
    if not cookie or not field:
        return False
    return hmac.compare_digest(cookie.encode(), field.encode())


def _mac(key: bytes, issued: str) -> str:
    return hmac.new(key, f"session:{issued}".encode(), hashlib.sha256).hexdigest()


def is_console(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


class ConsoleHeaders:
    """ASGI middleware: HEADERS on every /ui response, the token's redirects included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_console(scope["path"]):
            await self.app(scope, receive, send)
            return

        extra = {} if scope["path"].startswith("/ui/static/") else NO_STORE

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in (HEADERS | extra).items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_secured)
